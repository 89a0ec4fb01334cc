//! Reading the similarity join's inputs and assembling its build ([`Built`]): every partition
//! of every input read by its own task, the tasks building together (`super::crew`); or, for
//! a prefix-partitioned join, one partition of each input read by the output partition that
//! builds from it ([`Partial`]).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, new_empty_array};
use datafusion::arrow::compute::{cast, concat};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result, internal_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlanProperties;
use datafusion::physical_plan::metrics::Time;
use futures::StreamExt;

use super::build::{Prepared, TokenOrder, prepare};
use super::crew::{Crew, lock};
use super::exec::{Built, IdOrder, JoinInput};
use super::filter::{Collections, reserve};
use super::threshold::Threshold;
use crate::intersect::strings::{StringIds, is_string_list};
use crate::io::parquet_split::split_scan;

/// What a build reads and which pairs it keeps (the spread distributions).
#[derive(Debug, Default)]
pub(crate) struct Partial {
    /// The one partition of each input to read (`None`: every partition of every input).
    pub(crate) reads: Option<Vec<usize>>,
    /// Which pairs a spread join's partition keeps (`None`: all).
    pub(crate) rule: Option<PairRuleKind>,
    /// Whether a Parquet input of fewer row groups than threads may be read in row ranges
    /// (its files whole: only where the plan reads the whole input).
    pub(crate) split_scan: bool,
}

/// Which verified pairs a partition of a spread join emits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PairRuleKind {
    /// Prefix-partitioned: the pairs its bucket owns (`super::route::owns`).
    Owner { buckets: u32 },
    /// Replicated self-join: the pairs whose right set comes later (`Collections::id_ranks`).
    Replicated,
}

/// [`PairRuleKind`] over the build.
#[derive(Debug)]
pub(crate) enum PairRule {
    /// The sets' own tokens tell (the build keeps the routed order and each token's bucket).
    Owner(Threshold),
    /// The ids' ranks and the sets' order tell (`Collections::replicated_pair`). Both sides'
    /// columns are gathered into one (left rows, then right rows from `right_rows_from`), and a
    /// pair is written with its row of higher id on the left.
    Replicated { right_rows_from: u32 },
}

impl PairRule {
    /// The output rows (left input's, right input's) of the pair of sets `l` (left) and `r`
    /// (right) of `coll`, when this partition emits it.
    #[inline]
    pub(crate) fn rows(&self, coll: &Collections, l: u32, r: u32) -> Option<(u32, u32)> {
        match self {
            Self::Owner(threshold) => coll
                .owns(l as usize, r as usize, threshold)
                .then(|| (coll.row(l as usize), coll.row(r as usize))),
            Self::Replicated { right_rows_from } => {
                let row = |p: usize| match coll.side(p) {
                    0 => coll.row(p),
                    _ => right_rows_from + coll.row(p),
                };
                let (a, b) = coll.replicated_pair(l as usize, r as usize)?;
                Some((row(a), row(b)))
            }
        }
    }
}

/// Read every input to the end (or, with `partial`, one partition of each) and build the
/// state the probes share. `gathered[s]`: the columns of input `s` to keep.
///
/// Every partition of every input is read by its own task, all at once (a Parquet input of
/// fewer row groups than cores is read in row ranges: split_scan.rs). The tasks then build
/// together, on the threads they already run on (crew.rs): the last to finish its read builds,
/// the others help.
pub(crate) async fn build_collections(
    inputs: Vec<JoinInput>,
    gathered: Vec<Vec<usize>>,
    token_type: DataType,
    threshold: Threshold,
    context: Arc<TaskContext>,
    build_time: Time,
    partial: Partial,
) -> Result<Arc<Built>> {
    let reservation =
        Arc::new(MemoryConsumer::new("SimilarityJoinExec[build]").register(context.memory_pool()));
    let threads = match partial.reads {
        Some(_) => 1,
        None => context.session_config().target_partitions(),
    };
    let split = partial.reads.is_none()
        && partial.split_scan
        && crate::config::similarity_join_split_scan(context.session_config().options());
    let mut plans = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let plan = match split {
            true => split_scan(&input.plan, threads, &context, &reservation).await,
            false => None,
        }
        .unwrap_or_else(|| Arc::clone(&input.plan));
        plans.push(plan);
    }
    let parts: Vec<usize> = match &partial.reads {
        Some(reads) => vec![1; reads.len()],
        None => plans
            .iter()
            .map(|p| p.output_partitioning().partition_count())
            .collect(),
    };
    let readers = parts.iter().sum();
    let shared = Arc::new(Shared {
        crew: Crew::new(readers),
        reads: std::sync::Mutex::new(
            parts
                .iter()
                .map(|&n| (0..n).map(|_| None).collect())
                .collect(),
        ),
        built: std::sync::Mutex::new(None),
        // Token strings get their ids as the batches are read, from one map for both inputs.
        strings: std::sync::Mutex::new(
            is_string_list(&token_type).then(|| Arc::new(StringIds::new(4 * threads.max(1)))),
        ),
        string_bytes: std::sync::atomic::AtomicUsize::new(0),
        inputs,
        gathered,
        threshold,
        reservation,
        threads,
        build_time,
        rule: partial.rule,
    });
    if readers == 0 {
        return shared.assemble();
    }
    let mut tasks = Vec::with_capacity(readers);
    for (side, (plan, &n)) in plans.iter().zip(&parts).enumerate() {
        // The build's first step (each set sorted and deduplicated) runs in the read tasks
        // when they are as many as the build's threads (every core reads, so every core
        // takes its share, with no pause between the read and the build); an input of fewer
        // partitions leaves it to the build.
        let prepare_sets = n >= threads;
        for part in 0..n {
            let read = partial.reads.as_ref().map_or(part, |r| r[side]);
            let stream = plan.execute(read, Arc::clone(&context))?;
            let shared = Arc::clone(&shared);
            let token_type = token_type.clone();
            tasks.push(SpawnedTask::spawn(async move {
                // A task that ends before its part is done (a panic, an abort) lets the
                // helpers go, so that none waits for a build that will not come.
                struct Release<'a>(&'a Crew, bool);
                impl Drop for Release<'_> {
                    fn drop(&mut self) {
                        if !self.1 {
                            self.0.finish_build();
                        }
                    }
                }
                let mut release = Release(&shared.crew, false);
                let input = &shared.inputs[side];
                let strings = lock(&shared.strings).clone();
                let read = read_partition(
                    stream,
                    Arc::clone(&shared.reservation),
                    shared.gathered[side].clone(),
                    input.tokens,
                    token_type,
                    strings.map(|ids| (ids, &shared.string_bytes)),
                    prepare_sets,
                );
                let last = shared
                    .crew
                    .read(read, |read| lock(&shared.reads)[side][part] = Some(read))
                    .await;
                if last {
                    let built = shared.assemble();
                    *lock(&shared.built) = Some(built);
                    shared.crew.finish_build();
                } else {
                    shared.crew.help().await;
                }
                release.1 = true;
            }));
        }
    }
    for task in tasks {
        task.join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?;
    }
    let built = lock(&shared.built).take();
    match built {
        Some(built) => built,
        None => internal_err!("SimilarityJoinExec: the reads ended with no build"),
    }
}

/// What one read task returns: the kept columns' batches, the token column's batches and
/// (when the task prepares sets) the build's first step on each batch.
type ReadResult = Result<(Vec<Vec<ArrayRef>>, Vec<ArrayRef>, Option<Vec<Prepared>>)>;

/// What the read tasks share: their results, and what the one that builds needs.
struct Shared {
    crew: Crew,
    /// Per input, per partition: the read's result once it is in.
    reads: std::sync::Mutex<Vec<Vec<Option<ReadResult>>>>,
    built: std::sync::Mutex<Option<Result<Arc<Built>>>>,
    /// The ids of token strings (for lists of strings), dropped once every read is in.
    strings: std::sync::Mutex<Option<Arc<StringIds>>>,
    /// The bytes reserved for `strings`.
    string_bytes: std::sync::atomic::AtomicUsize,
    inputs: Vec<JoinInput>,
    gathered: Vec<Vec<usize>>,
    threshold: Threshold,
    reservation: Arc<MemoryReservation>,
    threads: usize,
    build_time: Time,
    /// Which verified pairs the partition emits.
    rule: Option<PairRuleKind>,
}

impl Shared {
    /// Every read is in: concatenate the kept columns and build (the leader's work; the
    /// build's parallel steps go to the crew).
    fn assemble(&self) -> Result<Arc<Built>> {
        let started = std::time::Instant::now();
        let reads = std::mem::take(&mut *lock(&self.reads));
        // Every token is an id now: the strings' map is no longer needed.
        if lock(&self.strings).take().is_some() {
            self.reservation.shrink(
                self.string_bytes
                    .swap(0, std::sync::atomic::Ordering::Relaxed),
            );
        }
        let self_join = self.inputs.len() == 1;
        let mut tokens = Vec::with_capacity(self.inputs.len());
        let mut columns = Vec::with_capacity(self.inputs.len());
        let mut prepared = Vec::with_capacity(self.inputs.len());
        for ((input, keep), side_reads) in self.inputs.iter().zip(&self.gathered).zip(reads) {
            let schema = input.plan.schema();
            let mut side_tokens = Vec::new();
            let mut side_columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); keep.len()];
            let mut side_prepared: Option<Vec<Prepared>> = None;
            for (i, read) in side_reads.into_iter().enumerate() {
                let Some(read) = read else {
                    return internal_err!("SimilarityJoinExec: a read task left no result");
                };
                let (part_columns, part_tokens, part_prepared) = read?;
                for (all, part) in side_columns.iter_mut().zip(part_columns) {
                    all.extend(part);
                }
                side_tokens.extend(part_tokens);
                match (i, &mut side_prepared, part_prepared) {
                    (0, all, part) => *all = part,
                    (_, Some(all), Some(part)) => all.extend(part),
                    _ => {}
                }
            }
            prepared.push(side_prepared);
            let mut side = vec![None; schema.fields().len()];
            for (k, &i) in keep.iter().enumerate() {
                let parts = &side_columns[k];
                let column = match parts.len() {
                    0 => new_empty_array(schema.field(i).data_type()),
                    1 => Arc::clone(&parts[0]),
                    _ => {
                        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                        let column = concat(&refs)?;
                        reserve(
                            &self.reservation,
                            column.get_array_memory_size(),
                            "the gathered columns",
                        )?;
                        column
                    }
                };
                side[i] = Some(column);
            }
            columns.push(side);
            tokens.push(side_tokens);
        }
        let _timer = self.build_time.timer();
        let gathered = std::time::Instant::now();
        let order = match self.rule {
            Some(PairRuleKind::Owner { buckets }) => TokenOrder::Routed { buckets },
            _ => TokenOrder::Frequency,
        };
        let mut collections = Collections::build(
            &tokens,
            prepared,
            order,
            &self.threshold,
            &self.reservation,
            self.threads,
            &self.crew,
        )?;
        drop(tokens);
        let collected = std::time::Instant::now();
        let id_order = match (self_join, self.inputs[0].id) {
            (true, Some(id)) => match columns[0].get(id) {
                Some(Some(ids)) => Some(IdOrder::new(Arc::clone(ids), collections.rows())?),
                _ => {
                    return internal_err!(
                        "SimilarityJoinExec: the self-join's id column was not kept"
                    );
                }
            },
            (true, None) => {
                return internal_err!("SimilarityJoinExec: a self-join needs an id column");
            }
            (false, _) => None,
        };
        let pair_rule = match self.rule {
            Some(PairRuleKind::Owner { .. }) => Some(PairRule::Owner(self.threshold)),
            Some(PairRuleKind::Replicated) => {
                let id = |side: usize| match self.inputs[side].id.and_then(|i| columns[side].get(i))
                {
                    Some(Some(c)) => Ok(Arc::clone(c)),
                    _ => {
                        internal_err!("SimilarityJoinExec: the replicated join's ids were not kept")
                    }
                };
                let (left, right) = (id(0)?, id(1)?);
                collections.rank_ids([left.as_ref(), right.as_ref()], &self.reservation)?;
                // Both sides' rows are numbered in one u32 space.
                let right_rows_from = u32::try_from(left.len())
                    .ok()
                    .filter(|&l| {
                        u32::try_from(right.len()).is_ok_and(|r| l.checked_add(r).is_some())
                    })
                    .ok_or_else(|| {
                        DataFusionError::Execution(
                            "similarity_join: 2^32 rows or more in a replicated join".into(),
                        )
                    })?;
                // One column of both sides' rows for each column the output reads.
                for i in 0..columns[0].len() {
                    if let (Some(Some(l)), Some(Some(r))) = (columns[0].get(i), columns[1].get(i)) {
                        let both = concat(&[l.as_ref(), r.as_ref()])?;
                        reserve(
                            &self.reservation,
                            both.get_array_memory_size(),
                            "the gathered columns",
                        )?;
                        columns[0][i] = Some(Arc::clone(&both));
                        columns[1][i] = Some(both);
                    }
                }
                Some(PairRule::Replicated { right_rows_from })
            }
            None => None,
        };
        log::debug!(
            "datafusion-sets: similarity_join assembled: columns gathered {:.2} ms, sets built \
             {:.2} ms, ids and pair rule {:.2} ms",
            (gathered - started).as_secs_f64() * 1e3,
            (collected - gathered).as_secs_f64() * 1e3,
            collected.elapsed().as_secs_f64() * 1e3
        );
        Ok(Arc::new(Built {
            collections,
            columns,
            id_order,
            pair_rule,
            _reservation: Arc::clone(&self.reservation),
            device_sets: std::sync::OnceLock::new(),
            device_join: std::sync::OnceLock::new(),
            every_pair_kept: std::sync::OnceLock::new(),
            probe_work: std::sync::OnceLock::new(),
        }))
    }
}

/// The batches of one input partition: the kept columns (`keep`'s order), the token column
/// cast to `token_type` (lists of strings then mapped to lists of ids by `strings`, whose
/// growth is reserved and added to its counter), and with `prepare_sets` the build's first step done on each batch as
/// it comes (its sets sorted and deduplicated: work that runs here, on every reading core,
/// instead of after the last read), each batch's memory reserved.
async fn read_partition(
    mut stream: SendableRecordBatchStream,
    reservation: Arc<MemoryReservation>,
    keep: Vec<usize>,
    tokens: usize,
    token_type: DataType,
    strings: Option<(Arc<StringIds>, &std::sync::atomic::AtomicUsize)>,
    prepare_sets: bool,
) -> Result<(Vec<Vec<ArrayRef>>, Vec<ArrayRef>, Option<Vec<Prepared>>)> {
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); keep.len()];
    let mut token_columns = Vec::new();
    let mut prepared = prepare_sets.then(Vec::new);
    loop {
        let Some(batch) = stream.next().await else {
            break;
        };
        let batch = batch?;
        reserve(
            &reservation,
            batch.get_array_memory_size(),
            "the input batches",
        )?;
        for (k, &i) in keep.iter().enumerate() {
            columns[k].push(Arc::clone(batch.column(i)));
        }
        let mut token_column = cast(batch.column(tokens), &token_type)?;
        if let Some((ids, bytes)) = &strings {
            let (mapped, grown) = ids.map_list(&token_column, "SimilarityJoinExec")?;
            reserve(&reservation, grown, "the token strings' ids")?;
            bytes.fetch_add(grown, std::sync::atomic::Ordering::Relaxed);
            token_column = mapped;
        }
        if let Some(prepared) = &mut prepared {
            prepared.push(prepare(&token_column, &reservation)?);
        }
        token_columns.push(token_column);
    }
    Ok((columns, token_columns, prepared))
}
