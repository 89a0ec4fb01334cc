//! Index tables loaded into memory, cached by the identity of the data they were read from.
//!
//! `topk_bm25` reads an index table (a `CREATE TABLE ... AS SELECT * FROM bm25_index(...)`
//! memory table, or a Parquet file registered as a table) once, builds the in-memory
//! [`InvertedIndex`], and keeps it for later queries while the data stays the same. Each
//! query plans the table's scan afresh and compares it with the cached one
//! ([`same_version`]: the same in-memory buffers, or the same files by location, size,
//! modification time and e-tag), so an `INSERT`, a replaced table or a rewritten file is
//! seen by the next search. A table whose scan has no such identity (a custom provider, a
//! view with a volatile expression) is read at every query, and its rows are matched instead:
//! when they are the very same buffers as a cached read's (what a host's in-memory table hands
//! over through FFI, without a copy), that read's index serves ([`RowsEntry`]).
//!
//! Memory: the rows read from files are reserved in the session's `MemoryPool` as they
//! arrive and the index before it is built, so a load over the limit fails with
//! ResourcesExhausted before it allocates. The index stays reserved while it is cached; an
//! entry goes when no table that read it is alive (checked at every load, and at once when
//! the session's catalog drops or replaces the table: [`evict_table`]). Each index keeps the
//! impacts of its [`SCORED_KEPT`] most recently used `sets.bm25_*` parameter sets, each
//! reserved while it lives.

use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use datafusion::arrow::array::{ArrayData, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::common::Result;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, execute_stream};
use futures::StreamExt;

use super::index::InvertedIndex;
use super::scoring::{Bm25Params, Scored};
use crate::catalog::resolve_table_async;
use crate::io::same_data::{
    has_identity, only_memory, reads_replaced_file, same_partition, same_version,
};

/// Parameter sets whose impacts an index keeps (most recently used first).
pub const SCORED_KEPT: usize = 2;

/// A loaded index and the impacts of the parameter sets it was last queried with.
#[derive(Debug)]
pub struct LoadedIndex {
    pub index: InvertedIndex,
    scored: Mutex<Vec<Arc<Scored>>>,
    pool: Arc<dyn MemoryPool>,
    name: String,
    _reservation: MemoryReservation,
}

/// A lock that a panic elsewhere does not poison for every later search (the guarded data
/// is replaced whole, never left half-written).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LoadedIndex {
    /// The impacts for `params`, computed on first use (reserved before they are) and kept
    /// while they are among the [`SCORED_KEPT`] most recently used.
    pub fn scored(&self, params: Bm25Params) -> Result<Arc<Scored>> {
        if let Some(s) = self.cached_scored(params) {
            return Ok(s);
        }
        let memory = MemoryConsumer::new(format!("{} scores", self.name)).register(&self.pool);
        memory.try_grow(Scored::bytes_for(&self.index))?;
        let s = Arc::new(Scored::new(&self.index, params).holding(memory));
        let mut kept = lock(&self.scored);
        if let Some(i) = kept.iter().position(|k| k.params == params) {
            return Ok(Arc::clone(&kept[i]));
        }
        kept.insert(0, Arc::clone(&s));
        kept.truncate(SCORED_KEPT);
        Ok(s)
    }

    fn cached_scored(&self, params: Bm25Params) -> Option<Arc<Scored>> {
        let mut kept = lock(&self.scored);
        let i = kept.iter().position(|k| k.params == params)?;
        let s = kept.remove(i);
        kept.insert(0, Arc::clone(&s));
        Some(s)
    }
}

struct Entry {
    /// The scan the index was read through: holding it keeps its batches alive, so no
    /// later scan can reuse their addresses.
    scan: Arc<dyn ExecutionPlan>,
    /// The tables that read these data last; the entry goes when none is alive.
    tables: Vec<Weak<dyn TableProvider>>,
    loaded: Arc<LoadedIndex>,
}

static CACHE: LazyLock<Mutex<Vec<Entry>>> = LazyLock::new(Default::default);

/// Reads of index tables whose scans have no identity (a table a host hands over through FFI,
/// a custom provider) that [`ROWS_KEPT`] at most are kept of, most recently used first.
static BY_ROWS: LazyLock<Mutex<Vec<RowsEntry>>> = LazyLock::new(Default::default);

/// Index tables without a scan identity whose last read is kept, with its index.
pub const ROWS_KEPT: usize = 4;

/// An index built from rows that are matched by their buffers. Holding the batches keeps
/// their addresses from being reused, so a later read that shows the same addresses shows the
/// same data (Arrow buffers do not change once shared). Rows that a read decodes afresh (a
/// file) never match again; a miss for the same table name drops the entry, so such a table
/// keeps at most its last read here.
struct RowsEntry {
    name: String,
    key: Vec<Vec<(usize, usize)>>,
    _batches: Vec<RecordBatch>,
    _rows: MemoryReservation,
    loaded: Arc<LoadedIndex>,
}

/// Each batch's buffers (address and length, children and null masks included), the batches
/// sorted: a scan over several partitions hands the same batches over in any order.
fn rows_key(batches: &[RecordBatch]) -> Vec<Vec<(usize, usize)>> {
    fn walk(data: &ArrayData, out: &mut Vec<(usize, usize)>) {
        out.push((data.offset(), data.len()));
        if let Some(nulls) = data.nulls() {
            let b = nulls.buffer();
            out.push((b.as_ptr() as usize, b.len()));
        }
        for b in data.buffers() {
            out.push((b.as_ptr() as usize, b.len()));
        }
        for c in data.child_data() {
            walk(c, out);
        }
    }
    let mut key: Vec<Vec<(usize, usize)>> = batches
        .iter()
        .map(|batch| {
            let mut k = vec![(batch.num_rows(), batch.num_columns())];
            for column in batch.columns() {
                walk(&column.to_data(), &mut k);
            }
            k
        })
        .collect();
    key.sort_unstable();
    key
}

/// The cached index of rows `key` read from table `name` (moved to the front), or `None`, and
/// then an entry of the same name, which read other rows, is dropped (returned, to be freed
/// after the lock).
fn find_rows(
    name: &str,
    key: &[Vec<(usize, usize)>],
) -> (Option<Arc<LoadedIndex>>, Vec<RowsEntry>) {
    let mut cache = lock(&BY_ROWS);
    if let Some(i) = cache.iter().position(|e| e.key == key) {
        let e = cache.remove(i);
        let loaded = Arc::clone(&e.loaded);
        cache.insert(0, e);
        return (Some(loaded), Vec::new());
    }
    let mut gone = Vec::new();
    let mut i = 0;
    while i < cache.len() {
        if cache[i].name == name {
            gone.push(cache.remove(i));
        } else {
            i += 1;
        }
    }
    (None, gone)
}

static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Index tables read and built in this process so far (a search served from the cache adds
/// nothing): how a host, a test or a Python user sees that an index is loaded once.
pub fn index_loads() -> u64 {
    LOADS.load(std::sync::atomic::Ordering::Relaxed)
}

fn same_table(w: &Weak<dyn TableProvider>, table: &Arc<dyn TableProvider>) -> bool {
    std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(table))
}

/// Forget `table` in every entry and drop the entries no live table reads.
fn sweep(cache: &mut Vec<Entry>, table: Option<*const ()>) -> Vec<Entry> {
    let mut gone = Vec::new();
    for e in cache.iter_mut() {
        e.tables.retain(|w| {
            w.strong_count() > 0 && table.is_none_or(|t| !std::ptr::addr_eq(w.as_ptr(), t))
        });
    }
    let mut i = 0;
    while i < cache.len() {
        if cache[i].tables.is_empty() {
            gone.push(cache.swap_remove(i));
        } else {
            i += 1;
        }
    }
    gone
}

/// Release what `table` (a provider the catalog has just dropped or replaced) holds in the
/// cache, and the shard partitions kept from its data. The entries are freed after the lock
/// is released.
pub fn evict_table(table: &Arc<dyn TableProvider>) {
    let gone = sweep(&mut lock(&CACHE), Some(Arc::as_ptr(table) as *const ()));
    drop(gone);
    evict_partitions(table);
}

/// Drop the kept shard partitions that read `table`'s data: a file under one of a listing
/// table's paths, or one of a memory table's batches. (A partition kept for another table
/// over the same files goes too, and is loaded again by its next query.)
fn evict_partitions(table: &Arc<dyn TableProvider>) {
    let reads: Box<dyn Fn(&DataSourceExec) -> bool> =
        if let Some(listing) = table.downcast_ref::<ListingTable>() {
            let urls = listing.table_paths().clone();
            Box::new(move |scan: &DataSourceExec| {
                let Some(files) = scan.data_source().downcast_ref::<FileScanConfig>() else {
                    return false;
                };
                urls.iter().any(|url| {
                    url.object_store() == files.object_store_url
                        && files.file_groups.iter().any(|g| {
                            g.iter()
                                .any(|f| url.contains(&f.object_meta.location, false))
                        })
                })
            })
        } else if let Some(memory) = table.downcast_ref::<MemTable>() {
            // A table being written holds its lock: its batches are new, none kept yet.
            let held: Vec<ArrayData> = memory
                .batches
                .iter()
                .filter_map(|p| p.try_read().ok().map(|b| b.clone()))
                .flatten()
                .flat_map(|b| b.columns().iter().map(|c| c.to_data()).collect::<Vec<_>>())
                .collect();
            Box::new(move |scan: &DataSourceExec| {
                let Some(batches) = scan.data_source().downcast_ref::<MemorySourceConfig>() else {
                    return false;
                };
                batches.partitions().iter().flatten().any(|b| {
                    b.columns()
                        .iter()
                        .any(|c| held.iter().any(|h| h.ptr_eq(&c.to_data())))
                })
            })
        } else {
            return;
        };
    let gone: Vec<PartitionEntry> = {
        let mut cache = lock(&PARTITIONS);
        let (gone, kept) = std::mem::take(&mut *cache)
            .into_iter()
            .partition(|e| leaves(&e.scan).iter().any(|scan| reads(scan)));
        *cache = kept;
        gone
    };
    drop(gone);
}

/// The scans at the leaves of `plan`.
fn leaves(plan: &Arc<dyn ExecutionPlan>) -> Vec<&DataSourceExec> {
    match plan.children().as_slice() {
        [] => plan.downcast_ref::<DataSourceExec>().into_iter().collect(),
        children => children.iter().flat_map(|c| leaves(c)).collect(),
    }
}

/// Shard partitions kept loaded in this process (diagnostics and tests).
pub fn kept_shard_partitions() -> usize {
    lock(&PARTITIONS).len()
}

/// An index table's scan, planned (the table resolved in the catalog), not yet read.
#[derive(Debug, Clone)]
pub struct IndexScan {
    /// The table (`None` for a scan decoded from another process's plan: then the index is
    /// not cached, as nothing tells when the table is dropped).
    table: Option<Arc<dyn TableProvider>>,
    scan: Arc<dyn ExecutionPlan>,
    name: String,
}

impl IndexScan {
    /// The scan of table `name`. `who` names the caller in errors; `arg` is the table
    /// argument's position.
    pub async fn plan(session: &dyn Session, name: &str, who: &str, arg: usize) -> Result<Self> {
        let table = resolve_table_async(who, session, name, arg).await?;
        let scan = table.scan(session, None, &[], None).await?;
        Ok(Self {
            table: Some(table),
            scan,
            name: name.to_string(),
        })
    }

    // Used by the codec (`proto` feature).
    #[cfg_attr(not(feature = "proto"), allow(dead_code))]
    /// The scan `scan` of the index table `name`, planned elsewhere (decoded from a plan
    /// another process sent).
    pub fn from_scan(name: &str, scan: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            table: None,
            scan,
            name: name.to_string(),
        }
    }

    // Used by the codec (`proto` feature).
    #[cfg_attr(not(feature = "proto"), allow(dead_code))]
    /// The planned scan of the index table.
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }

    /// The table's name as the query gave it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The index, loaded in `ctx` (or from the cache when its data are unchanged).
    pub async fn open(&self, ctx: Arc<TaskContext>, who: &str) -> Result<Arc<LoadedIndex>> {
        let Self { table, scan, name } = self;
        if !has_identity(scan) {
            return open_by_rows(ctx, Arc::clone(scan), who, name).await;
        }
        let Some(table) = table.as_ref() else {
            return Ok(Arc::new(load(ctx, Arc::clone(scan), who, name).await?));
        };
        {
            let mut cache = lock(&CACHE);
            let mut gone = sweep(&mut cache, None);
            if let Some(i) = cache.iter().position(|e| same_version(&e.scan, scan)) {
                let loaded = Arc::clone(&cache[i].loaded);
                if !cache[i].tables.iter().any(|w| same_table(w, table)) {
                    cache[i].tables.push(Arc::downgrade(table));
                }
                drop(cache);
                drop(gone);
                return Ok(loaded);
            }
            // This table's data changed: what it read before goes (unless another table
            // reads it too).
            gone.extend(sweep(&mut cache, Some(Arc::as_ptr(table) as *const ())));
            drop(cache);
            drop(gone);
        }
        let loaded = Arc::new(load(ctx, Arc::clone(scan), who, name).await?);
        let mut cache = lock(&CACHE);
        if let Some(e) = cache.iter_mut().find(|e| same_version(&e.scan, scan)) {
            // Loaded meanwhile by another query: keep one copy.
            if !e.tables.iter().any(|w| same_table(w, table)) {
                e.tables.push(Arc::downgrade(table));
            }
            return Ok(Arc::clone(&e.loaded));
        }
        cache.push(Entry {
            scan: Arc::clone(scan),
            tables: vec![Arc::downgrade(table)],
            loaded: Arc::clone(&loaded),
        });
        Ok(loaded)
    }
}

/// The index in table `name`, loaded (or from the cache when its data are unchanged).
/// `who` names the caller in errors; `arg` is the table argument's position.
pub async fn load_index(
    session: &dyn Session,
    name: &str,
    who: &str,
    arg: usize,
) -> Result<Arc<LoadedIndex>> {
    let scan = IndexScan::plan(session, name, who, arg).await?;
    scan.open(session.task_ctx(), who).await
}

/// The index of a scan without identity: its rows are read, and a cached index built from the
/// very same buffers serves; else the rows are indexed, and kept with the index
/// ([`RowsEntry`]).
async fn open_by_rows(
    ctx: Arc<TaskContext>,
    scan: Arc<dyn ExecutionPlan>,
    who: &str,
    name: &str,
) -> Result<Arc<LoadedIndex>> {
    let rows = read(&ctx, scan, who, name).await?;
    let key = rows_key(&rows.batches);
    let (found, gone) = find_rows(name, &key);
    drop(gone);
    if let Some(loaded) = found {
        return Ok(loaded);
    }
    // The kept rows stay reserved while they are cached.
    let mut rows = rows;
    let batches = rows.batches.clone();
    let reservation = rows.reservation.split(rows.bytes);
    rows.bytes = 0;
    let loaded = Arc::new(build(ctx, rows, who, name)?);
    let mut cache = lock(&BY_ROWS);
    if let Some(e) = cache.iter().find(|e| e.key == key) {
        // Loaded meanwhile by another query: keep one copy.
        return Ok(Arc::clone(&e.loaded));
    }
    cache.insert(
        0,
        RowsEntry {
            name: name.to_string(),
            key,
            _batches: batches,
            _rows: reservation,
            loaded: Arc::clone(&loaded),
        },
    );
    let keep = cache.len().min(ROWS_KEPT);
    let gone = cache.split_off(keep);
    drop(cache);
    drop(gone);
    Ok(loaded)
}

/// An index table's rows, read; those read from files are reserved (`bytes`).
struct Rows {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    reservation: MemoryReservation,
    bytes: usize,
}

/// Read `scan`, reserving the rows read from files as they arrive.
async fn read(
    ctx: &Arc<TaskContext>,
    scan: Arc<dyn ExecutionPlan>,
    who: &str,
    name: &str,
) -> Result<Rows> {
    // Batches of in-memory tables are the table's own, not new memory.
    let count_rows = !only_memory(&scan);
    let schema = scan.schema();
    let stream = execute_stream(scan, Arc::clone(ctx))?;
    read_stream(ctx, stream, schema, count_rows, who, name).await
}

/// Read `stream`, reserving its batches as they arrive when `count_rows`.
async fn read_stream(
    ctx: &Arc<TaskContext>,
    mut stream: SendableRecordBatchStream,
    schema: SchemaRef,
    count_rows: bool,
    who: &str,
    name: &str,
) -> Result<Rows> {
    let reservation =
        MemoryConsumer::new(format!("{who} index '{name}'")).register(ctx.memory_pool());
    let mut batches = Vec::new();
    let mut bytes = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if count_rows {
            let b = batch.get_array_memory_size();
            reservation.try_grow(b)?;
            bytes += b;
        }
        batches.push(batch);
    }
    Ok(Rows {
        schema,
        batches,
        reservation,
        bytes,
    })
}

/// Partitions of sharded index tables kept loaded, most recently used first (a shard plan's
/// task loads its partition's shards once while they stay unchanged).
pub const SHARDS_KEPT: usize = 64;

/// The index of partition `partition` of `scan` (`None`: the partition held no rows).
struct PartitionEntry {
    /// Holding the scan keeps its batches alive, as [`Entry::scan`] does.
    scan: Arc<dyn ExecutionPlan>,
    partition: usize,
    loaded: Option<Arc<LoadedIndex>>,
}

static PARTITIONS: LazyLock<Mutex<Vec<PartitionEntry>>> = LazyLock::new(Default::default);

/// Whether partition `p` of `a` and of `b` provably hold the same rows, for every `p`: they
/// read the same version of the same data ([`same_version`]: the same files in the same
/// groups, or the very same batches in the same partitions) through the same hash
/// repartitions (a round-robin one deals batches out in whatever order they come).
fn same_partitions(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> bool {
    fn alike(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> bool {
        if a.name() != b.name() || a.children().len() != b.children().len() {
            return false;
        }
        if let (Some(ra), Some(rb)) = (
            a.downcast_ref::<RepartitionExec>(),
            b.downcast_ref::<RepartitionExec>(),
        ) && !(matches!(ra.partitioning(), Partitioning::Hash(..))
            && ra.partitioning() == rb.partitioning())
        {
            return false;
        }
        a.children()
            .into_iter()
            .zip(b.children())
            .all(|(x, y)| alike(x, y))
    }
    same_version(a, b) && alike(a, b)
}

/// The index held by partition `partition` of `input` (whole shards of a sharded index
/// table, as [`crate::search::shards`] reads them), read and built in `ctx`, its rows and
/// the index reserved; `None` when the partition holds no rows. A partition whose rows have
/// an identity is kept loaded for later queries while its data stay the same: its own files
/// or batches ([`same_partition`], whatever the other partitions of the scan), or the whole
/// input's, through hash repartitions ([`same_partitions`]). One that an exchange between
/// processes has moved has none, and is read at every query. The flag: whether it came from
/// the kept ones.
pub async fn load_partition(
    ctx: Arc<TaskContext>,
    input: &Arc<dyn ExecutionPlan>,
    partition: usize,
    who: &str,
    name: &str,
) -> Result<(Option<Arc<LoadedIndex>>, bool)> {
    // Judged alone, a partition is found under another slicing of the table (another task's
    // share of it on a datafusion-distributed worker); through a hash repartition only with
    // every other partition the same.
    let alone = same_partition(input, partition, input, partition);
    let kept = alone || same_partitions(input, input);
    log::debug!(
        "datafusion-sets: {who} of '{name}', partition {partition}: {}",
        match (alone, kept) {
            (true, _) => "kept by its own files",
            (false, true) => "kept with the whole input",
            (false, false) => "not keepable (no identity)",
        }
    );
    let found = |cache: &[PartitionEntry]| {
        cache.iter().position(|e| match alone {
            true => same_partition(&e.scan, e.partition, input, partition),
            false => e.partition == partition && same_partitions(&e.scan, input),
        })
    };
    if kept {
        let mut cache = lock(&PARTITIONS);
        if let Some(i) = found(&cache) {
            let e = cache.remove(i);
            let loaded = e.loaded.clone();
            cache.insert(0, e);
            log::debug!("datafusion-sets: {who} of '{name}', partition {partition}: found kept");
            return Ok((loaded, true));
        }
    }
    let stream = input.execute(partition, Arc::clone(&ctx))?;
    let rows = read_stream(&ctx, stream, input.schema(), true, who, name).await?;
    let loaded = match rows.batches.iter().all(|b| b.num_rows() == 0) {
        true => None,
        false => Some(Arc::new(build(ctx, rows, who, name)?)),
    };
    let mut cache = lock(&PARTITIONS);
    // Entries that read an older version of a file this read saw (rewritten in place since)
    // can never be found again: they go now rather than when newer ones push them out.
    let (mut gone, current): (Vec<_>, Vec<_>) =
        std::mem::take(&mut *cache).into_iter().partition(|e| {
            // A partition kept by its own files: those files only.
            let own = same_partition(&e.scan, e.partition, &e.scan, e.partition);
            reads_replaced_file(&e.scan, own.then_some(e.partition), input)
        });
    *cache = current;
    if kept {
        if let Some(i) = found(&cache) {
            // Loaded meanwhile by another query: keep one copy.
            let loaded = cache[i].loaded.clone();
            drop(cache);
            drop(gone);
            return Ok((loaded, false));
        }
        cache.insert(
            0,
            PartitionEntry {
                scan: Arc::clone(input),
                partition,
                loaded: loaded.clone(),
            },
        );
        let keep = cache.len().min(SHARDS_KEPT);
        gone.extend(cache.split_off(keep));
    }
    // The entries are freed after the lock is released.
    drop(cache);
    drop(gone);
    Ok((loaded, false))
}

/// Read `scan` and build its index, reserving the rows read from files as they arrive and
/// the index before it is built.
async fn load(
    ctx: Arc<TaskContext>,
    scan: Arc<dyn ExecutionPlan>,
    who: &str,
    name: &str,
) -> Result<LoadedIndex> {
    let rows = read(&ctx, scan, who, name).await?;
    build(ctx, rows, who, name)
}

/// Build the index of `rows`, reserving it before it is built; the rows' reservation then
/// goes.
fn build(ctx: Arc<TaskContext>, rows: Rows, who: &str, name: &str) -> Result<LoadedIndex> {
    let Rows {
        schema,
        batches,
        reservation,
        bytes,
    } = rows;
    reservation.try_grow(InvertedIndex::load_bytes(&batches))?;
    let index = InvertedIndex::from_batches(&schema, &batches, who, name)?;
    LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    drop(batches);
    reservation.shrink(bytes);
    reservation.resize(index.size_bytes());
    Ok(LoadedIndex {
        index,
        scored: Mutex::new(Vec::new()),
        pool: Arc::clone(ctx.memory_pool()),
        name: format!("{who} index '{name}'"),
        _reservation: reservation,
    })
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::Column;

    use super::*;

    fn batch(v: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![v, v + 1]))]).unwrap()
    }

    #[test]
    fn partitions_are_the_same_only_through_the_same_hash_repartitions() {
        let parts = vec![vec![batch(1)], vec![batch(3)]];
        let schema = parts[0][0].schema();
        let scan = || MemorySourceConfig::try_new_exec(&parts, Arc::clone(&schema), None).unwrap();
        let (a, b) = (
            scan() as Arc<dyn ExecutionPlan>,
            scan() as Arc<dyn ExecutionPlan>,
        );
        assert!(same_partitions(&a, &b));
        // Other batches (equal values, other buffers): not provably the same.
        let copy = vec![vec![batch(1)], vec![batch(3)]];
        let other = MemorySourceConfig::try_new_exec(&copy, Arc::clone(&schema), None).unwrap();
        assert!(!same_partitions(&a, &(other as _)));
        let x = || Arc::new(Column::new("x", 0)) as _;
        let repartition = |input: &Arc<dyn ExecutionPlan>, p: Partitioning| {
            Arc::new(RepartitionExec::try_new(Arc::clone(input), p).unwrap())
                as Arc<dyn ExecutionPlan>
        };
        let hash = |n| Partitioning::Hash(vec![x()], n);
        assert!(same_partitions(
            &repartition(&a, hash(4)),
            &repartition(&b, hash(4))
        ));
        assert!(!same_partitions(
            &repartition(&a, hash(4)),
            &repartition(&b, hash(3))
        ));
        // Round robin deals batches out in the order they come: partition p is not fixed.
        let rr = Partitioning::RoundRobinBatch(4);
        assert!(!same_partitions(
            &repartition(&a, rr.clone()),
            &repartition(&b, rr)
        ));
    }
}
