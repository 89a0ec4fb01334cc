//! datafusion-distributed: the crate installed on a coordinating session and on workers.

use datafusion::common::Result;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt, WorkerQueryContext,
};

use super::codec::SetsCodec;
use crate::config::SetsConfig;
use crate::join::SimilarityJoinExec;

/// Installs datafusion-sets into a session that plans for datafusion-distributed.
pub trait SetsDistributedExt {
    /// [`crate::SessionStateBuilderExt::with_sets`], plus what a distributed query needs:
    /// the codec of the crate's nodes ([`SetsCodec`]), the `sets.*` options sent with every
    /// task, and the planner hint that keeps the similarity join in a stage of one task (its
    /// build reads the whole input). Call it on the coordinating session, with the
    /// distributed planner and worker resolver; workers build theirs with
    /// [`sets_worker_session`].
    fn with_sets_distributed(self) -> Self;
}

impl SetsDistributedExt for SessionStateBuilder {
    fn with_sets_distributed(self) -> Self {
        let (builder, session) = crate::session::install(self);
        builder
            .with_distributed_user_codec(SetsCodec::new(session))
            .with_distributed_option_extension(SetsConfig::default())
            .with_distributed_desired_task_count_handler(whole_input_operators)
    }
}

/// A worker's session for one query: `ctx.builder` with datafusion-sets installed, the
/// crate's codec, and the `sets.*` options the coordinating session sent. Pass it to
/// `Worker::from_session_builder`; a worker that needs more (its own tables, functions)
/// calls it from its own builder function.
pub async fn sets_worker_session(ctx: WorkerQueryContext) -> Result<SessionState> {
    let (builder, session) = crate::session::install(ctx.builder);
    Ok(builder
        .with_distributed_user_codec(SetsCodec::new(session))
        .with_distributed_option_extension_from_headers::<SetsConfig>(&ctx.headers)?
        .build())
}

/// The planner hint for the crate's nodes: a similarity join runs in a stage of one task
/// (each task's copy builds from every row it reads).
fn whole_input_operators(
    ev: DesiredTaskCountEvent<'_>,
) -> Option<Result<DesiredTaskCountEventResponse>> {
    ev.plan
        .is::<SimilarityJoinExec>()
        .then(|| Ok(DesiredTaskCountEventResponse::maximum(1)))
}
