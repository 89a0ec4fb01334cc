//! BM25 ranking over an inverted index stored as an Arrow table: tokenizer, index (Arrow and
//! in-memory forms), scoring, the top-k evaluators, and the loaded-index cache the SQL
//! functions (`functions::bm25_index`, `functions::topk_bm25`) share.

// The parts of `ExecutionPlan` every operator here implements alike (defined before the
// modules that use it).
macro_rules! plan_basics {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
        ) -> Result<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }
        fn properties(&self) -> &Arc<PlanProperties> {
            &self.properties
        }
        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![&self.input]
        }
        fn metrics(&self) -> Option<MetricsSet> {
            Some(self.metrics.clone_inner())
        }
    };
}

pub mod build;
pub mod catalog_watch;
pub mod gpu;
pub mod index;
pub mod loaded;
pub mod queries;
pub mod rank;
pub mod scoring;
pub mod shard_queries;
pub mod shards;
pub mod tokenize;
pub mod topk;
