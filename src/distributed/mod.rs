//! Plans that cross processes: [`SetsCodec`], the `datafusion-proto` codec of the crate's
//! nodes and stateful functions (`proto` feature), and with the `distributed` feature the
//! installers for datafusion-distributed: `SetsDistributedExt::with_sets_distributed` on
//! the coordinating session and `sets_worker_session` on each worker (docs/distributed.md).
//!
//! Exact under per-task execution: an engine runs a copy of a stage per task, each over a
//! slice of the input. The similarity join shares its build among the output partitions of
//! one copy and probes each set in the copy that runs its partition, so it asks for a stage
//! of one task, whose copy reads the whole input; `bm25_index` requires its input in one
//! partition, which datafusion-distributed gathers from every task of the stage below.

#[cfg(feature = "distributed")]
mod cluster;
mod codec;

pub use codec::SetsCodec;

use datafusion::execution::SessionStateBuilder;

/// [`crate::SessionStateBuilderExt::with_sets`], and the codec for the session the builder
/// builds: register it wherever that session encodes or decodes plans (a Ballista executor,
/// a custom transport). A plan encoded with one session's codec decodes with another's.
pub fn with_sets_codec(builder: SessionStateBuilder) -> (SessionStateBuilder, SetsCodec) {
    let (builder, session) = crate::session::install(builder);
    (builder, SetsCodec::new(session))
}
#[cfg(feature = "distributed")]
pub use cluster::{SetsDistributedExt, sets_worker_session};
