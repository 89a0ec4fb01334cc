//! `similarity_join_deal`: the physical rule that deals the input of a prefix-partitioned
//! similarity join's routers round-robin over the target partitions, after
//! `EnsureRequirements`.
//!
//! Each router routes the sets of its own input partition, and a Parquet scan gives each row
//! group to one partition: an input of one row group (what writers make of up to a million
//! rows) was routed on one core while the others waited. DataFusion adds no round-robin there
//! (the scan already has as many partitions as the target, some of them empty) and removes one
//! placed before `EnsureRequirements`, so this rule runs after it. Under datafusion-distributed
//! the deal stays inside a task: each task's row groups reach all its partitions. (A broadcast
//! or replicated join needs none: its plan instance reads all its partitions into one build,
//! and its partitions share the probes.)

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, replace_children_if_necessary};

use crate::join::route::PrefixRouteExec;

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
    node.downcast_ref::<PrefixRouteExec>().map(|_| 0)
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

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;
    use crate::SessionStateBuilderExt;

    /// The router's input in a prefix-partitioned join at 3 partitions; nothing at 1
    /// partition or in one shared build.
    #[tokio::test]
    async fn the_routers_inputs_are_dealt() {
        for (partitions, distribution, dealt) in
            [(3, "prefix", 1), (1, "prefix", 0), (3, "single", 0)]
        {
            let state = SessionStateBuilder::new()
                .with_default_features()
                .with_config(SessionConfig::new().with_target_partitions(partitions))
                .with_sets()
                .build();
            let ctx = SessionContext::from(state);
            for sql in [
                "CREATE TABLE s (id INT, t INT[]) AS VALUES (1, [1, 2, 3]), (2, [1, 2, 3, 4]), (3, [7])",
                &format!("SET sets.similarity_join_distribution = '{distribution}'"),
            ] {
                ctx.sql(sql).await.unwrap().collect().await.unwrap();
            }
            let sql =
                "SELECT a.id, b.id FROM s a JOIN s b ON a.id < b.id AND jaccard(a.t, b.t) >= 0.7";
            let plan = ctx
                .sql(sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let mut found = Vec::new();
            plan.apply(|node| {
                if node.downcast_ref::<PrefixRouteExec>().is_some() {
                    let input = node.children()[0];
                    found.push(
                        input
                            .downcast_ref::<RepartitionExec>()
                            .map(|r| r.partitioning().clone()),
                    );
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            })
            .unwrap();
            let want = vec![Some(Partitioning::RoundRobinBatch(partitions)); dealt];
            // A self-join: one input, one router.
            let routers = usize::from(distribution == "prefix");
            assert_eq!(found.len(), routers, "{distribution} at {partitions}");
            let found: Vec<_> = found.into_iter().flatten().collect();
            assert_eq!(found, want.into_iter().flatten().collect::<Vec<_>>());
            let rows: usize = ctx
                .sql(sql)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap()
                .iter()
                .map(|b| b.num_rows())
                .sum();
            assert_eq!(rows, 1, "{distribution} at {partitions}");
        }
    }
}
