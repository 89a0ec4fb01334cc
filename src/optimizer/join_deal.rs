//! `similarity_join_deal`: the physical rule that deals a spread similarity join's partitioned
//! input round-robin over the target partitions, after `EnsureRequirements`.
//!
//! A spread join's partitions each join what their own input partition holds: the routers of
//! a `prefix` join route their partition's sets, a `broadcast` or `replicated` join probes its
//! partition of the larger side. A Parquet scan gives each row group to one partition, so an
//! input of one row group (what writers make of up to a million rows) left one partition with
//! every set and the other cores idle (a replicated gcide_words join probed on one of two
//! cores). DataFusion adds no round-robin there (the scan already has as many partitions as
//! the target, some of them empty) and removes one placed before `EnsureRequirements`, so this
//! rule runs after it. Under datafusion-distributed the deal stays inside a task: each task's
//! row groups reach all its partitions.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, replace_children_if_necessary};

use crate::join::route::PrefixRouteExec;
use crate::join::{JoinDistribution, SimilarityJoinExec};

/// The rule's name (as `EXPLAIN VERBOSE` shows it).
pub const SIMILARITY_JOIN_DEAL: &str = "similarity_join_deal";

/// The physical optimizer rule (see the module docs).
#[derive(Debug, Default)]
pub struct SimilarityJoinDeal;

impl SimilarityJoinDeal {
    /// A new instance.
    pub fn new() -> Self {
        Self
    }
}

/// Which child of `node` is a spread join's partitioned input.
fn partitioned_child(node: &dyn ExecutionPlan) -> Option<usize> {
    if node.downcast_ref::<PrefixRouteExec>().is_some() {
        return Some(0);
    }
    let join = node.downcast_ref::<SimilarityJoinExec>()?;
    match join.distribution() {
        JoinDistribution::Broadcast | JoinDistribution::Replicated => Some(1),
        JoinDistribution::Single | JoinDistribution::Prefix { .. } => None,
    }
}

impl PhysicalOptimizerRule for SimilarityJoinDeal {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = config.execution.target_partitions;
        if partitions < 2 || !config.optimizer.enable_round_robin_repartition {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(i) = partitioned_child(node.as_ref()) else {
                return Ok(Transformed::no(node));
            };
            let mut children: Vec<_> = node.children().into_iter().cloned().collect();
            match children.get(i) {
                Some(child) if child.downcast_ref::<RepartitionExec>().is_none() => {
                    children[i] = Arc::new(RepartitionExec::try_new(
                        Arc::clone(child),
                        Partitioning::RoundRobinBatch(partitions),
                    )?);
                }
                _ => return Ok(Transformed::no(node)),
            }
            Ok(Transformed::yes(replace_children_if_necessary(
                node, children,
            )?))
        })
        .data()
    }

    fn name(&self) -> &str {
        SIMILARITY_JOIN_DEAL
    }

    fn schema_check(&self) -> bool {
        true
    }
}
