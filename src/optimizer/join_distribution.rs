//! `similarity_join_distribution`: the physical rule that decides how each similarity join
//! spreads over partitions and tasks (`sets.similarity_join_distribution`), and plans it:
//! - `single`: one build over the whole input, shared by the output partitions; the best
//!   plan in one process, and a stage of one task in a distributed one;
//! - `prefix`: the prefix-partitioned join (`crate::join::route`), each set sent to the
//!   buckets of its prefix tokens, each partition joining its own sets;
//! - `broadcast`: an R-S join whose smaller side every task reads whole, joined with its
//!   part of the larger side in one build per task; a self-join is `replicated`: the input
//!   read whole by every task, joined with its part of it, each pair found by the task
//!   holding its later set.
//!
//! `auto` (the default) keeps `single` in one process. Under datafusion-distributed (the
//! session has the `distributed` options, which its planner installs) it decides by the
//! inputs' statistics: `broadcast` for an R-S join whose smaller side has at most an eighth
//! of the rows of the other; else `single` while the token columns hold at most
//! [`SINGLE_MAX_BYTES`] (128 bytes a row where only the rows are known; one task's build on all its cores beat every spread by 10x and more
//! on gcide_words, 16 MB and 130 MB of tokens: benches/README.md); else `prefix` when a set of
//! the average size (the token column's bytes per row) has a probe prefix of at most 2
//! tokens, or the sizes are unknown; else `broadcast` (the smaller side) or `replicated`.
//! `EXPLAIN` shows the choice on the join.
//!
//! The rule runs after `similarity_join_rewrite` and before `EnsureRequirements`, which puts
//! the hash repartitions and the coalesce the new plans require around them.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::config::{JoinDistributionChoice, SetsConfig, under_distributed};
use crate::join::route::{MAX_BUCKETS, broadcast, element_type, prefix_partitioned, replicated};
use crate::join::{JoinDistribution, JoinInput, SimilarityJoinExec};

/// The rule's name (as `EXPLAIN VERBOSE` shows it).
pub const SIMILARITY_JOIN_DISTRIBUTION: &str = "similarity_join_distribution";

/// Buckets per target partition of a prefix-partitioned join: enough that the hash
/// repartition spreads them evenly over the partitions of every task.
const BUCKETS_PER_PARTITION: usize = 16;

/// The smaller side of an R-S join is broadcast when it has at most this fraction of the
/// other side's rows (`auto` under datafusion-distributed).
const BROADCAST_RATIO: usize = 8;

/// `auto` routes by prefix when a set of the average size has at most this long a prefix
/// (as many copies at most); longer prefixes replicate the sets so often that reading the
/// input whole in every task costs less.
const PREFIX_MAX_COPIES: u64 = 2;

/// `auto` keeps a join in one task while its inputs' token columns hold at most this many
/// bytes (by the statistics): below it a spread costs more in copies and reading than it
/// gains in cores.
pub const SINGLE_MAX_BYTES: usize = 1 << 30;

/// The bytes of a row's set when the statistics know the rows but not the token column's
/// bytes: 32 tokens of 4 bytes (gcide_words' average).
const ASSUMED_SET_BYTES: usize = 128;

/// The physical optimizer rule (see the module docs).
#[derive(Debug, Default)]
pub struct SimilarityJoinDistribution;

impl SimilarityJoinDistribution {
    /// A new instance.
    pub fn new() -> Self {
        Self
    }
}

/// What the statistics of a join input say: rows, and the average set size.
#[derive(Debug, Clone, Copy, Default)]
struct Estimate {
    rows: Option<usize>,
    set_size: Option<f64>,
    /// The token column's bytes.
    bytes: Option<usize>,
}

/// The statistics' estimate for `input` (token lists of `element`-typed values).
fn estimate(input: &JoinInput, element: &DataType) -> Estimate {
    let Ok(stats) = StatisticsContext::new().compute(input.plan.as_ref(), &StatisticsArgs::new())
    else {
        return Estimate::default();
    };
    let rows = stats.num_rows.get_value().copied();
    let bytes = stats
        .column_statistics
        .get(input.tokens)
        .and_then(|c| c.byte_size.get_value().copied())
        .or_else(|| stats.total_byte_size.get_value().copied());
    let width = element.primitive_width().unwrap_or(8).max(1) as f64;
    let set_size = match (rows, bytes) {
        (Some(r), Some(b)) if r > 0 => Some(b as f64 / r as f64 / width),
        _ => None,
    };
    Estimate {
        rows,
        set_size,
        bytes,
    }
}

/// The spread `auto` picks under datafusion-distributed for `join` (see the module docs);
/// `None`: one task.
fn auto(join: &SimilarityJoinExec) -> Option<Spread> {
    let element = element_type(&join.token_type).unwrap_or(DataType::Null);
    let left = estimate(&join.left, &element);
    let right = join.right.as_ref().map(|r| estimate(r, &element));
    if let Some(right) = right
        && let (Some(l), Some(r)) = (left.rows, right.rows)
    {
        if l.saturating_mul(BROADCAST_RATIO) <= r {
            return Some(Spread::Broadcast {
                right_is_small: false,
            });
        }
        if r.saturating_mul(BROADCAST_RATIO) <= l {
            return Some(Spread::Broadcast {
                right_is_small: true,
            });
        }
    }
    // Parquet scans know their rows but seldom a list column's bytes: then a set of
    // ASSUMED_SET_BYTES per row.
    let mut bytes = [Some(left), right].into_iter().flatten().map(|e| {
        e.bytes
            .or(e.rows.map(|r| r.saturating_mul(ASSUMED_SET_BYTES)))
    });
    if let Some(total) = bytes.try_fold(0usize, |a, b| Some(a.saturating_add(b?)))
        && total <= SINGLE_MAX_BYTES
    {
        return None;
    }
    // Prefix routing copies a set once per bucket of its prefix: cheap only for short
    // prefixes (high thresholds, small sets); else every task reads the (smaller) input whole.
    let mut sizes = [Some(left), right]
        .into_iter()
        .flatten()
        .map(|e| e.set_size);
    let longest = sizes.try_fold(0.0f64, |a, s| Some(a.max(s?)));
    let copies = longest.and_then(|n| join.threshold.prefix_len(n.round().max(1.0) as u64));
    Some(match copies {
        Some(c) if c <= PREFIX_MAX_COPIES => Spread::Prefix,
        None => Spread::Prefix,
        Some(_) => whole(left, right),
    })
}

/// Broadcast the smaller side (by rows), or replicate a self-join's input.
fn whole(left: Estimate, right: Option<Estimate>) -> Spread {
    match right {
        None => Spread::Replicated,
        Some(right) => Spread::Broadcast {
            right_is_small: matches!((left.rows, right.rows), (Some(l), Some(r)) if r < l),
        },
    }
}

/// A spread a join can take.
#[derive(Debug, Clone, Copy)]
enum Spread {
    Prefix,
    Broadcast { right_is_small: bool },
    Replicated,
}

impl PhysicalOptimizerRule for SimilarityJoinDistribution {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let choice = SetsConfig::from_options(config)?.similarity_join_distribution;
        let choice = match choice {
            JoinDistributionChoice::Auto if !under_distributed(config) => return Ok(plan),
            JoinDistributionChoice::Single => return Ok(plan),
            other => other,
        };
        let buckets = (BUCKETS_PER_PARTITION * config.execution.target_partitions)
            .clamp(BUCKETS_PER_PARTITION, MAX_BUCKETS as usize) as u32;
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<SimilarityJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if join.distribution() != JoinDistribution::Single {
                return Ok(Transformed::no(node));
            }
            let spread = match choice {
                JoinDistributionChoice::Broadcast => {
                    let element = DataType::Null;
                    let left = estimate(&join.left, &element);
                    let right = join.right.as_ref().map(|r| estimate(r, &element));
                    whole(left, right)
                }
                JoinDistributionChoice::Prefix => Spread::Prefix,
                _ => match auto(join) {
                    Some(spread) => spread,
                    None => return Ok(Transformed::no(node)),
                },
            };
            let spread = match spread {
                Spread::Prefix => prefix_partitioned(join, buckets)?,
                Spread::Broadcast { right_is_small } => broadcast(join, right_is_small)?,
                Spread::Replicated => replicated(join)?,
            };
            Ok(Transformed::yes(Arc::new(spread) as Arc<dyn ExecutionPlan>))
        })
        .data()
    }

    fn name(&self) -> &str {
        SIMILARITY_JOIN_DISTRIBUTION
    }

    fn schema_check(&self) -> bool {
        true
    }
}
