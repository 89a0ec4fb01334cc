//! A Parquet scan with fewer row groups than cores, split into row ranges (at page boundaries
//! where one is near an equal share, else inside a short page) so that every core decodes a
//! part of it.
//!
//! The join reads its whole input before it can build, and DataFusion gives a row group to one
//! task: a one-row-group file (what writers produce below a million rows) decodes on one thread
//! while the other cores wait. Reading it in row ranges needs the offset index (where each page
//! starts and which row it begins with), so that a task fetches and decompresses only its own
//! pages; without it every task decompresses the whole column chunk and the split costs what it
//! saves. Most writers write no offset index (pyarrow does not by default), so we derive it:
//! walk the page headers of each column chunk, and count the rows each page begins (a data page
//! v2 says so in its header; a v1 page of a flat column holds one value per row; a v1 page of a
//! repeated column begins one row per repetition level 0, counted after decompression, pages in
//! parallel). A row group is split only where every page of every column begins a row (the
//! offset index's own rule); otherwise it is read whole.
//!
//! The derived metadata lives in a process-wide cache keyed by the file's path and checked
//! against its size and modification time (DataFusion's own metadata cache works the same way),
//! so a file is walked once (a file version found unsplittable is remembered too, and read
//! whole without another walk). The split scan is a copy of the input's `DataSourceExec`
//! whose files carry a [`ParquetAccessPlan`] each (one row range) and whose reader takes the
//! metadata from that cache. Anything unexpected (encryption, a header that does not parse, row counts that do
//! not add up) leaves the scan as it was.
//!
//! The column chunks the split scan reads, when they add up to at most [`PRELOAD_MAX`] bytes and
//! the memory pool grants them, are read into memory once before the tasks start; the tasks then
//! decode without waiting for I/O (each wait could leave a core idle long enough to be slow to
//! wake).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf, Bytes};
use datafusion::common::{DataFusionError, Result};
// DataFusion 55 has two `CachedParquetMetaData`; `DFParquetMetadata` (which the cached reader
// factory uses) looks for the one in `metadata`.
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::metadata::{
    CachedParquetMetaData, DFParquetMetadata,
};
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetAccessPlan, ParquetFileReaderFactory, RowGroupAccess,
};
use datafusion::datasource::physical_plan::{FileGroup, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::execution::cache::cache_manager::{CachedFileMetadataEntry, FileMetadataCache};
use datafusion::execution::cache::default_cache::DefaultCache;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderOptions, RowSelection, RowSelector};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::column::page::{Page, PageReader};
use datafusion::parquet::errors::{ParquetError, Result as ParquetResult};
use datafusion::parquet::file::metadata::{
    ColumnChunkMetaData, PageIndexPolicy, ParquetMetaData, ParquetMetaDataBuilder,
};
use datafusion::parquet::file::page_index::column_index::ColumnIndexMetaData;
use datafusion::parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use datafusion::parquet::file::reader::{ChunkReader, Length};
use datafusion::parquet::file::serialized_reader::SerializedPageReader;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, Label, MetricBuilder, MetricCategory, MetricType,
};
use futures::future::BoxFuture;
use rayon::prelude::*;

/// Bytes of derived metadata the process keeps (a page location is 24 bytes).
const CACHE_BYTES: usize = 64 << 20;

/// The derived metadata of the files of one object store (the cache is keyed by path, as the
/// reader factory looks it up; a path names different files in different stores).
fn cache(store: &ObjectStoreUrl) -> Arc<FileMetadataCache> {
    static CACHES: OnceLock<Mutex<HashMap<String, Arc<FileMetadataCache>>>> = OnceLock::new();
    let mut caches = CACHES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let cache = caches.entry(store.as_str().to_owned()).or_insert_with(|| {
        Arc::new(DefaultCache::new(CACHE_BYTES).with_name("datafusion-sets: derived offset index"))
    });
    Arc::clone(cache)
}

/// File versions whose pages cannot all be located (some page continues a row), by object
/// store, path, size, modification time and e-tag: read whole without walking their page
/// headers again. Forgotten all at once when it reaches [`UNSPLITTABLE_MAX`] entries.
static UNSPLITTABLE: OnceLock<Mutex<HashSet<UnsplittableKey>>> = OnceLock::new();
const UNSPLITTABLE_MAX: usize = 4096;

/// A file version: store, path, size, modification time, e-tag and version.
type UnsplittableKey = (String, String, u64, i64, Option<String>, Option<String>);

/// Whether the file version was found unsplittable before; `mark` records that it is.
fn unsplittable(store: &ObjectStoreUrl, meta: &ObjectMeta, mark: bool) -> bool {
    let mut set = UNSPLITTABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (
        store.as_str().to_owned(),
        meta.location.to_string(),
        meta.size,
        meta.last_modified.timestamp_nanos_opt().unwrap_or(i64::MIN),
        meta.e_tag.clone(),
        meta.version.clone(),
    );
    if mark {
        if set.len() >= UNSPLITTABLE_MAX {
            set.clear();
        }
        set.insert(key);
        true
    } else {
        set.contains(&key)
    }
}

/// `plan` read in about `pieces` row ranges, when it is a Parquet scan with fewer row groups
/// than `pieces` whose pages can be located; `None` leaves it as it is.
pub(crate) async fn split_scan(
    plan: &Arc<dyn ExecutionPlan>,
    pieces: usize,
    context: &TaskContext,
    reservation: &MemoryReservation,
) -> Option<Arc<dyn ExecutionPlan>> {
    match try_split(plan, pieces, context, reservation, PRELOAD_MAX).await {
        Ok(split) => split,
        Err(e) => {
            log::debug!("similarity join: the Parquet scan is read as planned: {e}");
            None
        }
    }
}

async fn try_split(
    plan: &Arc<dyn ExecutionPlan>,
    pieces: usize,
    context: &TaskContext,
    reservation: &MemoryReservation,
    preload_max: u64,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(exec) = plan.downcast_ref::<DataSourceExec>() else {
        return Ok(None);
    };
    let Some((config, source)) = exec.downcast_to_file_source::<ParquetSource>() else {
        return Ok(None);
    };
    // A limit, a predicate (page pruning reads a column index we do not derive), decryption,
    // a reader factory other than DataFusion's own, or an access plan someone else chose: read
    // as planned. (DataFusion's reader factory is replaced by one reading the same object
    // store through the cache of derived metadata.)
    if pieces < 2
        || config.limit.is_some()
        || source
            .parquet_file_reader_factory()
            .is_some_and(|f| !datafusion_reader_factory(f.as_ref()))
        || FileSource::filter(source).is_some()
        || source
            .table_parquet_options()
            .crypto
            .file_decryption
            .is_some()
    {
        return Ok(None);
    }
    // The distinct files (DataFusion may have cut one file into byte ranges).
    let mut files: Vec<PartitionedFile> = Vec::new();
    for file in config.file_groups.iter().flat_map(|g| g.iter()) {
        if !file.extensions.is_empty() {
            return Ok(None);
        }
        if !files
            .iter()
            .any(|f| f.object_meta.location == file.object_meta.location)
        {
            files.push(file.clone());
        }
    }
    let store = context
        .runtime_env()
        .object_store(&config.object_store_url)?;
    let cache = cache(&config.object_store_url);
    let mut metadata = Vec::with_capacity(files.len());
    for file in &files {
        metadata.push(fetch_metadata(&store, cache.as_ref(), &file.object_meta).await?);
    }
    let row_groups: usize = metadata.iter().map(|(m, _)| m.num_row_groups()).sum();
    if row_groups >= pieces {
        return Ok(None);
    }
    let total = metadata
        .iter()
        .map(|(m, _)| file_rows(m))
        .sum::<usize>()
        .max(1);
    let mut groups = Vec::new();
    let mut split_any = false;
    for (file, (meta, cached)) in files.iter().zip(&metadata) {
        let url = &config.object_store_url;
        let meta = match meta.offset_index() {
            Some(_) => Some(Arc::clone(meta)),
            None if unsplittable(url, &file.object_meta, false) => None,
            None => derive_offset_index(&store, &file.object_meta, meta, reservation).await?,
        };
        let Some(meta) = meta else {
            // Some page does not begin a row: read whole, now and for later queries.
            unsplittable(url, &file.object_meta, true);
            groups.push(FileGroup::new(vec![whole(file)]));
            continue;
        };
        let n = meta.num_row_groups();
        for g in 0..n {
            let rows = meta.row_group(g).num_rows() as usize;
            let want = (pieces * rows).div_ceil(total).max(1);
            for range in cut_row_group(&meta, g, want) {
                split_any |= range.len() < rows;
                let mut access = vec![RowGroupAccess::Skip; n];
                access[g] = RowGroupAccess::Selection(selection(range, rows));
                let piece = whole(file).with_extension(ParquetAccessPlan::new(access));
                groups.push(FileGroup::new(vec![piece]));
            }
        }
        if *cached {
            continue;
        }
        cache.put(
            &file.object_meta.location,
            CachedFileMetadataEntry::new(
                file.object_meta.clone(),
                Arc::new(CachedParquetMetaData::new(meta)),
            ),
        );
    }
    if !split_any {
        return Ok(None);
    }
    log::debug!(
        "similarity join: the Parquet scan of {} file(s), {row_groups} row group(s), read in {} row ranges",
        files.len(),
        groups.len()
    );
    let mut split = config.clone();
    split.file_groups = groups;
    // Each piece stays with its partition (no work sharing between sibling streams), so the
    // partitions read in order give the rows in file order, as the scan planned does: the
    // build's tie order (and so the join's work, not its answer) stays the same.
    split.preserve_order = true;
    let schema = plan.schema();
    let columns: HashSet<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let with_meta: Vec<(&PartitionedFile, &ParquetMetaData)> = files
        .iter()
        .zip(&metadata)
        .map(|(f, (m, _))| (f, m.as_ref()))
        .collect();
    let preloaded = preload(&store, &with_meta, &columns, context, preload_max).await;
    let cached = CachedParquetFileReaderFactory::new(store, cache);
    let factory: Arc<dyn ParquetFileReaderFactory> = match preloaded {
        Some((chunks, reservation)) => Arc::new(PreloadedReaderFactory {
            inner: cached,
            unreported: Mutex::new(chunks.keys().cloned().collect()),
            files: chunks
                .into_iter()
                .map(|(path, c)| (path, Arc::new(c)))
                .collect(),
            _reservation: reservation,
        }),
        None => Arc::new(cached),
    };
    split.file_source = Arc::new(source.clone().with_parquet_file_reader_factory(factory));
    Ok(Some(DataSourceExec::from_data_source(split)))
}

/// The column chunks that the split scan reads, together at most this many bytes, are read into
/// memory once before its tasks start, and the tasks decode from there. Reading through the
/// object store, each task waited for its column chunks on a blocking thread; on a virtual
/// machine a core left idle by that wait can take milliseconds to wake, and one task then waited
/// for the other to finish (debian_deps on two cores: the read 5.2 ms instead of 2.8-3.0 in 4-12
/// of 17 queries).
const PRELOAD_MAX: u64 = 64 << 20;

/// Preloaded column chunks of one file: (first byte, bytes), in file order, not overlapping.
type Chunks = Vec<(u64, Bytes)>;

/// The byte ranges of the column chunks of the columns named in `columns` (by their top-level
/// field), over all row groups, in file order, overlapping and adjacent ones merged.
fn chunk_ranges(meta: &ParquetMetaData, columns: &HashSet<&str>) -> Vec<Range<u64>> {
    let schema = meta.file_metadata().schema_descr();
    let mut chunks: Vec<Range<u64>> = meta
        .row_groups()
        .iter()
        .flat_map(|group| group.columns().iter().enumerate())
        .filter(|(leaf, _)| columns.contains(schema.get_column_root(*leaf).name()))
        .map(|(_, column)| {
            let (start, len) = column.byte_range();
            start..start.saturating_add(len)
        })
        .filter(|r| !r.is_empty())
        .collect();
    chunks.sort_unstable_by_key(|r| r.start);
    let mut ranges: Vec<Range<u64>> = Vec::with_capacity(chunks.len());
    for r in chunks {
        match ranges.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => ranges.push(r),
        }
    }
    ranges
}

/// Each file's chunks of the scanned `columns` (by path), when they add up to at most `max`
/// bytes and the memory pool grants them; else `None` (the tasks read through the object
/// store).
async fn preload(
    store: &Arc<dyn ObjectStore>,
    files: &[(&PartitionedFile, &ParquetMetaData)],
    columns: &HashSet<&str>,
    context: &TaskContext,
    max: u64,
) -> Option<(HashMap<String, Chunks>, MemoryReservation)> {
    let ranges: Vec<Vec<Range<u64>>> = files
        .iter()
        .map(|(_, meta)| chunk_ranges(meta, columns))
        .collect();
    let total = ranges
        .iter()
        .flatten()
        .try_fold(0u64, |t, r| t.checked_add(r.end - r.start))?;
    if total == 0 || total > max {
        return None;
    }
    let reservation = MemoryConsumer::new("SimilarityJoinExec[preloaded column chunks]")
        .register(context.memory_pool());
    reservation.try_grow(usize::try_from(total).ok()?).ok()?;
    let mut chunks = HashMap::with_capacity(files.len());
    for ((file, _), ranges) in files.iter().zip(ranges) {
        let location = &file.object_meta.location;
        match store.get_ranges(location, &ranges).await {
            Ok(got) if got.len() == ranges.len() => {
                let file_chunks = ranges.iter().map(|r| r.start).zip(got).collect();
                chunks.insert(location.to_string(), file_chunks);
            }
            Ok(_) => return None,
            Err(e) => {
                log::debug!("similarity join: {location} not preloaded: {e}");
                return None;
            }
        }
    }
    Some((chunks, reservation))
}

/// DataFusion's cached reader factory, with the column chunks it holds served from memory
/// (the footer and page index still come from the cache of derived metadata; any other range
/// from the object store).
struct PreloadedReaderFactory {
    inner: CachedParquetFileReaderFactory,
    files: HashMap<String, Arc<Chunks>>,
    /// The files whose preloaded bytes are not yet in the scan's `bytes_scanned`.
    unreported: Mutex<HashSet<String>>,
    _reservation: MemoryReservation,
}

/// The files and how many bytes are held, not the bytes (plans print their factories).
impl std::fmt::Debug for PreloadedReaderFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes: usize = self
            .files
            .values()
            .flat_map(|c| c.iter())
            .map(|(_, b)| b.len())
            .sum();
        let mut paths: Vec<&String> = self.files.keys().collect();
        paths.sort();
        f.debug_struct("PreloadedReaderFactory")
            .field("inner", &self.inner)
            .field("files", &paths)
            .field("bytes", &bytes)
            .finish_non_exhaustive()
    }
}

impl ParquetFileReaderFactory for PreloadedReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Box<dyn AsyncFileReader + Send>> {
        let location = file.object_meta.location.as_ref();
        let chunks = self.files.get(location).cloned();
        // What the preload read from the store goes into the scan's `bytes_scanned` (same
        // name, label, kind and category as its reader's counter, which counts what it
        // fetches itself), once per file: the bytes the pieces then take from memory are not
        // read again.
        let first = self
            .unreported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(location);
        if let (true, Some(chunks)) = (first, &chunks) {
            MetricBuilder::new(metrics)
                .with_label(Label::new("filename", location.to_string()))
                .with_type(MetricType::Summary)
                .with_category(MetricCategory::Bytes)
                .counter("bytes_scanned", partition_index)
                .add(chunks.iter().map(|(_, b)| b.len()).sum());
        }
        let inner = self
            .inner
            .create_reader(partition_index, file, metadata_size_hint, metrics)?;
        Ok(match chunks {
            Some(chunks) => Box::new(PreloadedReader { inner, chunks }),
            None => inner,
        })
    }
}

/// A file's byte ranges from its preloaded chunks where they lie in one, else from `inner`.
struct PreloadedReader {
    inner: Box<dyn AsyncFileReader + Send>,
    chunks: Arc<Chunks>,
}

impl AsyncFileReader for PreloadedReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, ParquetResult<Bytes>> {
        match preloaded_range(&self.chunks, &range) {
            Some(bytes) => Box::pin(std::future::ready(Ok(bytes))),
            None => self.inner.get_bytes(range),
        }
    }

    /// The ranges in the preloaded chunks from memory, the others in one call to `inner`.
    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, ParquetResult<Vec<Bytes>>> {
        let got: Vec<Option<Bytes>> = ranges
            .iter()
            .map(|r| preloaded_range(&self.chunks, r))
            .collect();
        let missing: Vec<Range<u64>> = (ranges.into_iter().zip(&got))
            .filter(|(_, g)| g.is_none())
            .map(|(r, _)| r)
            .collect();
        if missing.is_empty() {
            return Box::pin(std::future::ready(Ok(got.into_iter().flatten().collect())));
        }
        let wanted = missing.len();
        let fetch = self.inner.get_byte_ranges(missing);
        Box::pin(async move {
            let fetched = fetch.await?;
            if fetched.len() != wanted {
                return Err(ParquetError::General(format!(
                    "similarity_join's split scan: {} byte ranges read for {wanted}",
                    fetched.len()
                )));
            }
            let mut fetched = fetched.into_iter();
            Ok(got
                .into_iter()
                .map(|g| g.or_else(|| fetched.next()).unwrap_or_default())
                .collect())
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, ParquetResult<Arc<ParquetMetaData>>> {
        self.inner.get_metadata(options)
    }
}

/// `range` of the file, without a copy, when it lies within one preloaded chunk.
fn preloaded_range(chunks: &[(u64, Bytes)], range: &Range<u64>) -> Option<Bytes> {
    if range.start > range.end {
        return None;
    }
    // The last chunk starting at or before the range.
    let k = chunks.partition_point(|(start, _)| *start <= range.start);
    let (start, bytes) = chunks.get(k.checked_sub(1)?)?;
    let from = usize::try_from(range.start.checked_sub(*start)?).ok()?;
    let to = usize::try_from(range.end.checked_sub(*start)?).ok()?;
    (to <= bytes.len()).then(|| bytes.slice(from..to))
}

/// Whether `f` is one of DataFusion's own Parquet reader factories, which the split may
/// replace by its cached one: told by the type name its `Debug` form begins with (the trait
/// offers no downcast), so a factory of any other type (a custom reader, a cache of its own,
/// another store) is kept and the scan read as planned.
pub(crate) fn datafusion_reader_factory(f: &dyn ParquetFileReaderFactory) -> bool {
    let name = format!("{f:?}");
    let type_name = name
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next();
    matches!(
        type_name,
        Some("CachedParquetFileReaderFactory" | "DefaultParquetFileReaderFactory")
    )
}

/// `file` read whole: no byte range (the pieces say which rows), no statistics (a piece's are
/// not the file's).
fn whole(file: &PartitionedFile) -> PartitionedFile {
    let mut file = file.clone();
    file.range = None;
    file.statistics = None;
    file
}

fn file_rows(meta: &ParquetMetaData) -> usize {
    meta.row_groups()
        .iter()
        .map(|g| g.num_rows() as usize)
        .sum()
}

/// Rows `range` of a row group of `rows` rows.
fn selection(range: Range<usize>, rows: usize) -> RowSelection {
    let mut selectors = Vec::with_capacity(3);
    if range.start > 0 {
        selectors.push(RowSelector::skip(range.start));
    }
    selectors.push(RowSelector::select(range.len()));
    if range.end < rows {
        selectors.push(RowSelector::skip(rows - range.end));
    }
    RowSelection::from(selectors)
}

/// Row group `g` in at most `want` row ranges of about equal rows, cut at page starts of its
/// largest column where one is near (see [`cuts`]; a task may start inside a page of any
/// column and skip to its first row).
fn cut_row_group(meta: &ParquetMetaData, g: usize, want: usize) -> Vec<Range<usize>> {
    let rows = meta.row_group(g).num_rows() as usize;
    let starts = match want > 1 && rows > 0 {
        true => page_starts(meta, g),
        false => Vec::new(),
    };
    cuts(&starts, rows, want)
}

/// The first row of each page of row group `g`'s largest column (compressed), from the offset
/// index; empty without one.
fn page_starts(meta: &ParquetMetaData, g: usize) -> Vec<usize> {
    let Some(index) = meta.offset_index() else {
        return Vec::new();
    };
    let columns = meta.row_group(g).columns();
    let largest = (0..columns.len())
        .max_by_key(|&c| columns[c].compressed_size())
        .unwrap_or(0);
    index
        .get(g)
        .and_then(|columns| columns.get(largest))
        .map(|o| {
            o.page_locations()
                .iter()
                .map(|p| p.first_row_index as usize)
                .collect()
        })
        .unwrap_or_default()
}

/// The row ranges between `want - 1` cut points near `k * rows / want` (`starts`: the page
/// starts of the largest column, ascending, the first 0): the nearest page start when it lies
/// within 1/32 of a range's share, else, when the page holding that row is no longer than a
/// share, the row itself, else the nearest page start. A cut inside a page has both tasks
/// decompress that page and the second skip its first rows. Measured with two tasks
/// (median of 28 queries, the later task's read): `debian_deps` (pages of 20,000 rows, cut
/// at 20,000 of 58,048 before) 3.15 -> 2.9 ms; `gcide_words` (pages of ~15,600 rows, the
/// nearest start 5,170 rows from the middle) balanced, 17.2 / 20.0 -> 19.3 / 19.9 ms (the skip
/// costs about what the balance saves there). Every range non-empty, together exactly
/// `0..rows`.
fn cuts(starts: &[usize], rows: usize, want: usize) -> Vec<Range<usize>> {
    let mut bounds = vec![0];
    let share = rows / want.max(1);
    for k in 1..want {
        let target = k * rows / want;
        // The page holding `target`: its start (the start at or below it) and its end (the
        // next start); the nearest usable start is one of the two (ties: the lower).
        let page = starts.partition_point(|&s| s <= target);
        let below = page.checked_sub(1).map(|p| starts[p]);
        let above = starts.get(page).copied();
        let page_rows = above.unwrap_or(rows) - below.unwrap_or(0);
        let nearest = [below, above]
            .into_iter()
            .flatten()
            .filter(|&s| s > 0 && s < rows)
            .min_by_key(|&s| s.abs_diff(target));
        let cut = match nearest {
            Some(s) if s.abs_diff(target) <= share / 32 => s,
            _ if page_rows <= share => target,
            Some(s) => s,
            None => continue,
        };
        if cut > *bounds.last().unwrap_or(&0) && cut < rows {
            bounds.push(cut);
        }
    }
    bounds.push(rows);
    bounds
        .windows(2)
        .map(|w| w[0]..w[1])
        .filter(|r| !r.is_empty())
        .collect()
}

/// The file's footer, with its page index when it has one, and whether it came from `cache`.
async fn fetch_metadata(
    store: &Arc<dyn ObjectStore>,
    cache: &FileMetadataCache,
    object_meta: &ObjectMeta,
) -> Result<(Arc<ParquetMetaData>, bool)> {
    if let Some(entry) = cache.get(&object_meta.location)
        && entry.is_valid_for(object_meta)
        && let Some(cached) = entry
            .file_metadata
            .as_any()
            .downcast_ref::<CachedParquetMetaData>()
    {
        return Ok((Arc::clone(cached.parquet_metadata()), true));
    }
    let meta = DFParquetMetadata::new(store.as_ref(), object_meta)
        .with_page_index_policy(Some(PageIndexPolicy::Optional))
        .fetch_metadata()
        .await?;
    Ok((meta, false))
}

/// `meta` with an offset index derived from the page headers, or `None` when some page does
/// not begin a row or cannot be read.
async fn derive_offset_index(
    store: &Arc<dyn ObjectStore>,
    object_meta: &ObjectMeta,
    meta: &ParquetMetaData,
    reservation: &MemoryReservation,
) -> Result<Option<Arc<ParquetMetaData>>> {
    let mut index = Vec::with_capacity(meta.num_row_groups());
    for group in meta.row_groups() {
        let mut columns = Vec::with_capacity(group.num_columns());
        for column in group.columns() {
            let (start, len) = column.byte_range();
            let len = usize::try_from(len).map_err(|e| DataFusionError::External(Box::new(e)))?;
            reservation.try_grow(len).map_err(|e| {
                e.context(format!(
                    "SimilarityJoinExec: the memory pool refused {len} bytes for a column chunk's page headers"
                ))
            })?;
            let bytes = store
                .get_range(&object_meta.location, start..start + len as u64)
                .await;
            let located = bytes
                .map_err(|e| DataFusionError::External(Box::new(e)))
                .map(|bytes| locate_pages(ChunkAt { start, bytes }, column, group.num_rows()));
            reservation.shrink(len);
            match located? {
                Some(pages) => columns.push(OffsetIndexMetaData {
                    page_locations: pages,
                    unencoded_byte_array_data_bytes: None,
                }),
                None => return Ok(None),
            }
        }
        index.push(columns);
    }
    let none = meta
        .row_groups()
        .iter()
        .map(|g| vec![ColumnIndexMetaData::NONE; g.num_columns()])
        .collect();
    let derived = ParquetMetaDataBuilder::new_from_metadata(meta.clone())
        .set_offset_index(Some(index))
        .set_column_index(Some(none))
        .build();
    Ok(Some(Arc::new(derived)))
}

/// One column chunk's bytes, addressed by file offset.
#[derive(Clone)]
struct ChunkAt {
    start: u64,
    bytes: Bytes,
}

impl Length for ChunkAt {
    fn len(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl ChunkReader for ChunkAt {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> datafusion::parquet::errors::Result<Self::T> {
        Ok(self.get_bytes(start, 0)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> datafusion::parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.start)
            .map(|s| s as usize)
            .filter(|&s| s <= self.bytes.len());
        let Some(from) = from else {
            return Err(datafusion::parquet::errors::ParquetError::EOF(format!(
                "offset {start} outside the column chunk"
            )));
        };
        let to = if length == 0 {
            self.bytes.len()
        } else {
            (from + length).min(self.bytes.len())
        };
        Ok(self.bytes.slice(from..to))
    }
}

/// A data page found by walking a column chunk's headers.
struct Found {
    offset: u64,
    /// Header and body.
    size: usize,
    /// Rows the page begins, when its header says (v2, or v1 of a flat column).
    rows: Option<usize>,
    /// Levels in the page (v1).
    levels: usize,
}

/// Where each data page of `column` starts and the first row of each, or `None` when a page
/// does not begin a row or something does not add up to `rows`.
fn locate_pages(
    chunk: ChunkAt,
    column: &ColumnChunkMetaData,
    rows: i64,
) -> Option<Vec<PageLocation>> {
    let max_rep = column.column_descr().max_rep_level();
    let mut found = Vec::new();
    let mut at = 0usize;
    while at < chunk.bytes.len() {
        let (header, header_len) = PageHeader::parse(&chunk.bytes[at..])?;
        let size = header_len.checked_add(usize::try_from(header.compressed_size).ok()?)?;
        match header.page_type {
            DATA_PAGE => {
                let levels = usize::try_from(header.num_values).ok()?;
                if max_rep > 0 && header.rep_encoding != Some(RLE) {
                    return None;
                }
                found.push(Found {
                    offset: chunk.start + at as u64,
                    size,
                    rows: (max_rep == 0).then_some(levels),
                    levels,
                });
            }
            DATA_PAGE_V2 => found.push(Found {
                offset: chunk.start + at as u64,
                size,
                rows: Some(usize::try_from(header.num_rows?).ok()?),
                levels: 0,
            }),
            DICTIONARY_PAGE if found.is_empty() => {}
            INDEX_PAGE => {}
            _ => return None,
        }
        at = at.checked_add(size)?;
    }
    if at != chunk.bytes.len() || found.is_empty() {
        return None;
    }
    let counts: Vec<Option<usize>> = found
        .par_iter()
        .map(|page| match page.rows {
            Some(rows) => Some(rows),
            None => rows_begun(&chunk, column, page, max_rep),
        })
        .collect();
    let mut first = 0usize;
    let mut pages = Vec::with_capacity(found.len());
    for (page, count) in found.iter().zip(counts) {
        pages.push(PageLocation {
            offset: page.offset as i64,
            compressed_page_size: i32::try_from(page.size).ok()?,
            first_row_index: first as i64,
        });
        first += count?;
    }
    (first as i64 == rows).then_some(pages)
}

/// The rows a v1 page of a repeated column begins: its repetition levels equal to 0, read
/// after decompressing the page; `None` when the page does not begin with one.
fn rows_begun(
    chunk: &ChunkAt,
    column: &ColumnChunkMetaData,
    page: &Found,
    max_rep: i16,
) -> Option<usize> {
    let location = PageLocation {
        offset: page.offset as i64,
        compressed_page_size: i32::try_from(page.size).ok()?,
        first_row_index: 0,
    };
    let mut reader =
        SerializedPageReader::new(Arc::new(chunk.clone()), column, 0, Some(vec![location])).ok()?;
    if page.offset != chunk.start {
        // The reader takes the bytes before its first location for a dictionary page.
        reader.skip_next_page().ok()?;
    }
    let Some(Page::DataPage { buf, .. }) = reader.get_next_page().ok()? else {
        return None;
    };
    let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let levels = buf.get(4..4usize.checked_add(len)?)?;
    let width = (16 - (max_rep as u16).leading_zeros()) as u8;
    let (zeros, first_is_zero) = count_zero_levels(levels, width, page.levels)?;
    first_is_zero.then_some(zeros)
}

/// How many of the first `n` levels of an RLE / bit-packed hybrid run of `width`-bit values
/// are 0, and whether the first one is; `None` when the run is shorter than `n`.
fn count_zero_levels(data: &[u8], width: u8, n: usize) -> Option<(usize, bool)> {
    if n == 0 || width == 0 || width > 16 {
        return None;
    }
    let mut at = 0usize;
    let mut left = n;
    let mut zeros = 0usize;
    let mut first = None;
    while left > 0 {
        let header = varint(data, &mut at)?;
        if header & 1 == 0 {
            let count = usize::try_from(header >> 1).ok()?;
            let bytes = width.div_ceil(8) as usize;
            let value = data
                .get(at..at + bytes)?
                .iter()
                .rev()
                .fold(0u32, |v, &b| (v << 8) | b as u32);
            at += bytes;
            let take = count.min(left);
            if take > 0 {
                first.get_or_insert(value == 0);
            }
            if value == 0 {
                zeros += take;
            }
            left -= take;
        } else {
            let values = usize::try_from(header >> 1).ok()?.checked_mul(8)?;
            let bytes = usize::try_from(header >> 1)
                .ok()?
                .checked_mul(width as usize)?;
            let packed = data.get(at..at.checked_add(bytes)?)?;
            at += bytes;
            let take = values.min(left);
            let w = width as usize;
            for i in 0..take {
                let bit = i * w;
                let mut v = 0u32;
                for b in 0..w {
                    let p = bit + b;
                    v |= (((packed[p / 8] >> (p % 8)) & 1) as u32) << b;
                }
                if i == 0 {
                    first.get_or_insert(v == 0);
                }
                zeros += (v == 0) as usize;
            }
            left -= take;
        }
    }
    Some((zeros, first?))
}

fn varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

// Page types and the one level encoding we read, as the format numbers them.
const DATA_PAGE: i32 = 0;
const INDEX_PAGE: i32 = 1;
const DICTIONARY_PAGE: i32 = 2;
const DATA_PAGE_V2: i32 = 3;
const RLE: i32 = 3;

/// The fields of a Parquet page header (Thrift compact protocol) that locate a page.
#[derive(Debug, PartialEq)]
struct PageHeader {
    page_type: i32,
    compressed_size: i32,
    /// v1: levels in the page.
    num_values: i32,
    /// v1: how the repetition levels are encoded.
    rep_encoding: Option<i32>,
    /// v2: rows in the page.
    num_rows: Option<i32>,
}

impl PageHeader {
    /// The header at the start of `data` and its length in bytes.
    fn parse(data: &[u8]) -> Option<(Self, usize)> {
        let mut r = Compact { data, at: 0 };
        let mut header = PageHeader {
            page_type: -1,
            compressed_size: -1,
            num_values: 0,
            rep_encoding: None,
            num_rows: None,
        };
        r.each_field(|r, id, kind| {
            match (id, kind) {
                (1, I32) => header.page_type = r.i32()?,
                (3, I32) => header.compressed_size = r.i32()?,
                (5, STRUCT) => r.each_field(|r, id, kind| {
                    match (id, kind) {
                        (1, I32) => header.num_values = r.i32()?,
                        (4, I32) => header.rep_encoding = Some(r.i32()?),
                        _ => r.skip(kind, 0)?,
                    }
                    Some(())
                })?,
                (8, STRUCT) => r.each_field(|r, id, kind| {
                    match (id, kind) {
                        (3, I32) => header.num_rows = Some(r.i32()?),
                        _ => r.skip(kind, 0)?,
                    }
                    Some(())
                })?,
                _ => r.skip(kind, 0)?,
            }
            Some(())
        })?;
        (header.compressed_size >= 0).then_some((header, r.at))
    }
}

// Thrift compact protocol type codes.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

/// A reader of the Thrift compact protocol, enough to walk a page header.
struct Compact<'a> {
    data: &'a [u8],
    at: usize,
}

impl Compact<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        varint(self.data, &mut self.at)
    }

    fn i32(&mut self) -> Option<i32> {
        let v = self.varint()?;
        i32::try_from((v >> 1) as i64 ^ -((v & 1) as i64)).ok()
    }

    /// Calls `f(reader, field id, type)` for each field of the struct that starts here.
    fn each_field(&mut self, mut f: impl FnMut(&mut Self, i16, u8) -> Option<()>) -> Option<()> {
        let mut last = 0i16;
        loop {
            let b = self.byte()?;
            if b == 0 {
                return Some(());
            }
            let kind = b & 0x0f;
            let delta = (b >> 4) as i16;
            let id = if delta == 0 {
                i16::try_from(self.i32()?).ok()?
            } else {
                last.checked_add(delta)?
            };
            last = id;
            f(self, id, kind)?;
        }
    }

    /// Skips an element of a list, set or map: as a value, but a bool is a byte there.
    fn skip_element(&mut self, kind: u8, depth: u32) -> Option<()> {
        if kind == BOOL_TRUE || kind == BOOL_FALSE {
            self.byte().map(|_| ())
        } else {
            self.skip(kind, depth)
        }
    }

    /// Skips a value of type `kind` (`depth`: nesting, bounded against malformed input).
    fn skip(&mut self, kind: u8, depth: u32) -> Option<()> {
        if depth > 32 {
            return None;
        }
        match kind {
            BOOL_TRUE | BOOL_FALSE => {}
            BYTE => {
                self.byte()?;
            }
            I16 | I32 | I64 => {
                self.varint()?;
            }
            DOUBLE => self.at = self.at.checked_add(8).filter(|&e| e <= self.data.len())?,
            BINARY => {
                let len = usize::try_from(self.varint()?).ok()?;
                self.at = self.at.checked_add(len).filter(|&e| e <= self.data.len())?;
            }
            LIST | SET => {
                let b = self.byte()?;
                let count = match b >> 4 {
                    15 => usize::try_from(self.varint()?).ok()?,
                    n => n as usize,
                };
                // Every element takes at least a byte: a count beyond the bytes left is
                // malformed (and would loop for as long as the count says).
                if count > self.data.len() - self.at {
                    return None;
                }
                let elem = b & 0x0f;
                for _ in 0..count {
                    self.skip_element(elem, depth + 1)?;
                }
            }
            MAP => {
                let count = usize::try_from(self.varint()?).ok()?;
                if count > 0 {
                    let kinds = self.byte()?;
                    if count > self.data.len() - self.at {
                        return None;
                    }
                    for _ in 0..count {
                        self.skip_element(kinds >> 4, depth + 1)?;
                        self.skip_element(kinds & 0x0f, depth + 1)?;
                    }
                }
            }
            STRUCT => self.each_field(|r, _, kind| r.skip(kind, depth + 1))?,
            _ => return None,
        }
        Some(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use datafusion::arrow::array::{
        ArrayRef, ListBuilder, RecordBatch, StringArray, UInt32Array, UInt32Builder,
    };
    use datafusion::arrow::compute::concat_batches;
    use datafusion::datasource::physical_plan::parquet::DefaultParquetFileReaderFactory;
    use datafusion::execution::memory_pool::MemoryConsumer;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::basic::{Compression, ZstdLevel};
    use datafusion::parquet::file::properties::{
        EnabledStatistics, WriterProperties, WriterVersion,
    };
    use datafusion::physical_plan::{ExecutionPlanProperties, collect, collect_partitioned};
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// Rows of (id, tokens, name): lists of 0..40 values, some NULL, some empty.
    fn batch(rows: usize, seed: u64) -> RecordBatch {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut lists = ListBuilder::new(UInt32Builder::new());
        for _ in 0..rows {
            match rng.random_range(0..20) {
                0 => lists.append_null(),
                1 => lists.append(true),
                _ => {
                    for _ in 0..rng.random_range(1..40) {
                        lists.values().append_value(rng.random_range(0..500));
                    }
                    lists.append(true);
                }
            }
        }
        let ids: ArrayRef = Arc::new(UInt32Array::from_iter_values(0..rows as u32));
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("row {i}")),
        ));
        RecordBatch::try_from_iter([
            ("id", ids),
            ("tokens", Arc::new(lists.finish()) as ArrayRef),
            ("name", names),
        ])
        .unwrap()
    }

    /// `batch` written as one row group of small pages; with or without an offset index.
    fn write(path: &std::path::Path, batch: &RecordBatch, index: bool, version: WriterVersion) {
        let props = WriterProperties::builder()
            .set_writer_version(version)
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_data_page_row_count_limit(300)
            .set_write_batch_size(100)
            .set_max_row_group_row_count(Some(1 << 20))
            .set_statistics_enabled(match index {
                true => EnabledStatistics::Page,
                false => EnabledStatistics::Chunk,
            })
            .set_offset_index_disabled(!index)
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }

    async fn scan(ctx: &SessionContext, path: &std::path::Path) -> Arc<dyn ExecutionPlan> {
        ctx.register_parquet("t", path.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        let plan = ctx
            .sql("SELECT id, tokens, name FROM t")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        assert!(plan.downcast_ref::<DataSourceExec>().is_some(), "{plan:?}");
        plan
    }

    fn reservation(ctx: &SessionContext) -> MemoryReservation {
        MemoryConsumer::new("test").register(&ctx.runtime_env().memory_pool)
    }

    /// The `Debug` form of a Parquet scan's reader factory.
    fn reader_factory(plan: &Arc<dyn ExecutionPlan>) -> String {
        let (_, source) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|e| e.downcast_to_file_source::<ParquetSource>())
            .expect("a Parquet scan");
        format!(
            "{:?}",
            source.parquet_file_reader_factory().expect("a factory")
        )
    }

    /// The local store of `ctx`, and the file at `path`: its location, footer and listing.
    async fn local_file(
        ctx: &SessionContext,
        path: &std::path::Path,
    ) -> (
        Arc<dyn ObjectStore>,
        datafusion::object_store::path::Path,
        Arc<ParquetMetaData>,
        PartitionedFile,
    ) {
        let store = ctx
            .runtime_env()
            .object_store(ObjectStoreUrl::local_filesystem())
            .unwrap();
        let location = datafusion::object_store::path::Path::from_filesystem_path(path).unwrap();
        let object_meta = store.head(&location).await.unwrap();
        let meta = DFParquetMetadata::new(store.as_ref(), &object_meta)
            .fetch_metadata()
            .await
            .unwrap();
        (store, location, meta, PartitionedFile::from(object_meta))
    }

    /// The scanned columns' chunks are preloaded when they fit the limit and the memory pool,
    /// held in the pool until the factory is dropped; otherwise nothing is.
    #[tokio::test]
    async fn column_chunks_preload_within_the_limit_and_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.parquet");
        write(&path, &batch(3_000, 1), false, WriterVersion::PARQUET_2_0);
        let on_disk = std::fs::read(&path).unwrap();
        let ctx_with = |limit: usize| {
            let rt = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
                .with_memory_limit(limit, 1.0)
                .build_arc()
                .unwrap();
            SessionContext::new_with_config_rt(SessionConfig::new(), rt)
        };
        let ctx = ctx_with(on_disk.len() * 4);
        let (store, location, meta, file) = local_file(&ctx, &path).await;
        let files = [(&file, meta.as_ref())];
        let task = ctx.task_ctx();
        let all: HashSet<&str> = ["id", "tokens", "name"].into();
        let tokens: HashSet<&str> = ["tokens", "not a column"].into();
        let mut sizes = Vec::new();
        for columns in [&all, &tokens] {
            let (chunks, reservation) = preload(&store, &files, columns, &task, PRELOAD_MAX)
                .await
                .expect("small chunks in a large enough pool");
            let chunks = &chunks[location.as_ref()];
            let size: usize = chunks.iter().map(|(_, b)| b.len()).sum();
            for (start, bytes) in chunks {
                let start = *start as usize;
                assert_eq!(bytes.as_ref(), &on_disk[start..start + bytes.len()]);
            }
            assert_eq!(reservation.size(), size);
            assert_eq!(task.memory_pool().reserved(), size);
            drop(reservation);
            assert_eq!(task.memory_pool().reserved(), 0);
            sizes.push(size);
        }
        // The three chunks of the one row group lie back to back: one range.
        assert_eq!(chunk_ranges(&meta, &all).len(), 1);
        // Every column chunk (the footer aside), or the token column's alone.
        assert!(
            sizes[0] < on_disk.len() && sizes[0] > on_disk.len() / 2,
            "{sizes:?}"
        );
        assert!(sizes[1] < sizes[0], "{sizes:?}");
        let (start, len) = meta.row_group(0).column(1).byte_range();
        assert_eq!(sizes[1], len as usize);
        assert!(
            preload(&store, &files, &tokens, &task, PRELOAD_MAX)
                .await
                .unwrap()
                .0[location.as_ref()][0]
                .0
                == start
        );
        // Over the limit, more than the pool grants, or no scanned column: not preloaded.
        let over = sizes[0] as u64 - 1;
        assert!(preload(&store, &files, &all, &task, over).await.is_none());
        let small = ctx_with(sizes[0] - 1);
        assert!(
            preload(&store, &files, &all, &small.task_ctx(), PRELOAD_MAX)
                .await
                .is_none()
        );
        assert_eq!(small.task_ctx().memory_pool().reserved(), 0);
        let none: HashSet<&str> = ["other"].into();
        assert!(
            preload(&store, &files, &none, &task, PRELOAD_MAX)
                .await
                .is_none()
        );
    }

    /// A reader that holds one column's chunk reads the whole file right: that chunk from
    /// memory, the other columns from the store.
    #[tokio::test]
    async fn a_preloaded_reader_reads_what_it_lacks_from_the_store() {
        use datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder;
        use futures::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.parquet");
        let data = batch(4_000, 3);
        write(&path, &data, false, WriterVersion::PARQUET_1_0);
        let ctx = SessionContext::new();
        let (store, location, meta, file) = local_file(&ctx, &path).await;
        let tokens: HashSet<&str> = ["tokens"].into();
        let (chunks, reservation) = preload(
            &store,
            &[(&file, meta.as_ref())],
            &tokens,
            &ctx.task_ctx(),
            PRELOAD_MAX,
        )
        .await
        .unwrap();
        let chunks = Arc::new(chunks[location.as_ref()].clone());
        assert_eq!(chunks.len(), 1);
        let held = chunks[0].1.len();
        let metrics = ExecutionPlanMetricsSet::new();
        let inner = CachedParquetFileReaderFactory::new(
            Arc::clone(&store),
            cache(&ObjectStoreUrl::local_filesystem()),
        )
        .create_reader(0, file, None, &metrics)
        .unwrap();
        let reader = PreloadedReader { inner, chunks };
        drop(reservation);
        let got: Vec<RecordBatch> = ParquetRecordBatchStreamBuilder::new(reader)
            .await
            .unwrap()
            .build()
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(concat_batches(&data.schema(), &got).unwrap(), data);
        // The store's reader was asked for the other columns only (its own count).
        let from_store = metrics
            .clone_inner()
            .sum_by_name("bytes_scanned")
            .map_or(0, |v| v.as_usize());
        let file_size = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(from_store > 0 && from_store + held <= file_size);
    }

    /// A range inside one preloaded chunk is a slice of it; any other range is not served
    /// from memory.
    #[test]
    fn preloaded_ranges() {
        let file: Vec<u8> = (0u8..100).collect();
        let chunks: Chunks = vec![
            (10, Bytes::copy_from_slice(&file[10..30])),
            (50, Bytes::copy_from_slice(&file[50..60])),
        ];
        for inside in [10..30u64, 12..20, 50..60, 59..60, 20..20] {
            let got = preloaded_range(&chunks, &inside).expect("inside a chunk");
            assert_eq!(
                got.as_ref(),
                &file[inside.start as usize..inside.end as usize]
            );
        }
        for outside in [
            0..5u64,
            5..15,
            25..35,
            30..31,
            45..55,
            55..61,
            60..61,
            99..100,
        ] {
            assert!(preloaded_range(&chunks, &outside).is_none(), "{outside:?}");
        }
        assert!(preloaded_range(&chunks, &Range { start: 20, end: 15 }).is_none());
        assert!(preloaded_range(&[], &(0..1)).is_none());
    }

    /// The offset index derived from the page headers equals the one the writer wrote, and
    /// the split scan returns every row once, in order, for v1 and v2 pages.
    #[tokio::test]
    async fn derived_index_and_split_scan_match_the_writer_and_the_plain_scan() {
        let dir = tempfile::tempdir().unwrap();
        for (k, version) in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0]
            .into_iter()
            .enumerate()
        {
            let data = batch(5_000, k as u64);
            let plain = dir.path().join(format!("plain{k}.parquet"));
            let indexed = dir.path().join(format!("indexed{k}.parquet"));
            write(&plain, &data, false, version);
            write(&indexed, &data, true, version);

            let ctx =
                SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
            let store = ctx
                .runtime_env()
                .object_store(
                    datafusion::execution::object_store::ObjectStoreUrl::local_filesystem(),
                )
                .unwrap();
            let meta_of = |p: &std::path::Path| {
                let path = datafusion::object_store::path::Path::from_filesystem_path(p).unwrap();
                let store = Arc::clone(&store);
                async move { store.head(&path).await.unwrap() }
            };
            let written = DFParquetMetadata::new(store.as_ref(), &meta_of(&indexed).await)
                .with_page_index_policy(Some(PageIndexPolicy::Required))
                .fetch_metadata()
                .await
                .unwrap();
            let plain_meta = meta_of(&plain).await;
            let footer = DFParquetMetadata::new(store.as_ref(), &plain_meta)
                .fetch_metadata()
                .await
                .unwrap();
            assert!(footer.offset_index().is_none());
            assert_eq!(footer.num_row_groups(), 1);
            let derived = derive_offset_index(&store, &plain_meta, &footer, &reservation(&ctx))
                .await
                .unwrap()
                .expect("every page of these files begins a row");
            let pages = |m: &ParquetMetaData| -> Vec<Vec<(i32, i64)>> {
                m.offset_index().unwrap()[0]
                    .iter()
                    .map(|c| {
                        c.page_locations()
                            .iter()
                            .map(|p| (p.compressed_page_size, p.first_row_index))
                            .collect()
                    })
                    .collect()
            };
            // Same sizes and first rows; the offsets differ by the files' layouts only if the
            // writers differ (they do not: same data, same properties but the index).
            assert_eq!(pages(&derived), pages(&written), "{version:?}");
            assert!(
                pages(&derived)[1].len() > 4,
                "the test wants several pages per column"
            );

            let plan = scan(&ctx, &plain).await;
            let expected = collect(Arc::clone(&plan), ctx.task_ctx()).await.unwrap();
            let expected = concat_batches(&plan.schema(), &expected).unwrap();
            // Some of these splits cut inside a page of the largest column, so the comparison
            // below covers a task starting mid-page in every column.
            let largest = page_starts(&derived, 0);
            let inside = [2, 3, 4, 7]
                .into_iter()
                .flat_map(|pieces| cut_row_group(&derived, 0, pieces))
                .filter(|r| !largest.contains(&r.start))
                .count();
            assert!(inside > 0, "{version:?}: no cut inside a page");
            // The scan's bytes_scanned (the split plans share the scan's metrics, so a read
            // is the difference).
            let scanned = |p: &Arc<dyn ExecutionPlan>| {
                p.metrics()
                    .and_then(|m| m.sum_by_name("bytes_scanned"))
                    .map_or(0, |v| v.as_usize())
            };
            // Every column is scanned, so the preload holds the file's column chunks.
            let schema = plan.schema();
            let names: HashSet<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            let held: u64 = chunk_ranges(&footer, &names)
                .iter()
                .map(|r| r.end - r.start)
                .sum();
            // Read from the preloaded file (small here) and, with no preloading allowed,
            // through the object store.
            for (pieces, preload_max) in [2, 3, 4, 7]
                .into_iter()
                .flat_map(|p| [(p, PRELOAD_MAX), (p, 0)])
            {
                let split = try_split(
                    &plan,
                    pieces,
                    &ctx.task_ctx(),
                    &reservation(&ctx),
                    preload_max,
                )
                .await
                .unwrap()
                .expect("a one-row-group Parquet scan is split");
                let factory = reader_factory(&split);
                assert_eq!(
                    factory.starts_with("PreloadedReaderFactory"),
                    preload_max > 0,
                    "{factory}"
                );
                // The held bytes are counted, not printed.
                assert!(factory.len() < 2_000, "{} characters", factory.len());
                let parts = split.output_partitioning().partition_count();
                assert!(
                    parts > 1 && parts <= pieces,
                    "{parts} partitions for {pieces}"
                );
                let before = scanned(&split);
                let got = collect_partitioned(Arc::clone(&split), ctx.task_ctx())
                    .await
                    .unwrap();
                let read = scanned(&split) - before;
                let got: Vec<RecordBatch> = got.into_iter().flatten().collect();
                let got = concat_batches(&plan.schema(), &got).unwrap();
                assert_eq!(got, expected, "{version:?}, {pieces} pieces");
                // bytes_scanned: what came from the store. Preloaded, the chunks once;
                // through the store, each piece's pages (a page cut by two pieces is read
                // by both), so more.
                if preload_max > 0 {
                    assert_eq!(read as u64, held, "{version:?}, {pieces} pieces");
                } else {
                    assert!(read as u64 > held, "{version:?}, {pieces} pieces: {read}");
                }
            }
            ctx.deregister_table("t").unwrap();
        }
    }

    /// Not split: one piece wanted, or as many row groups as pieces.
    #[tokio::test]
    async fn scans_that_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        write(&path, &batch(1_000, 7), false, WriterVersion::PARQUET_1_0);
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2));
        let plan = scan(&ctx, &path).await;
        assert!(
            split_scan(&plan, 1, &ctx.task_ctx(), &reservation(&ctx))
                .await
                .is_none()
        );
        // A plan that is not a Parquet scan.
        let values = ctx
            .sql("VALUES (1)")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        assert!(
            split_scan(&values, 4, &ctx.task_ctx(), &reservation(&ctx))
                .await
                .is_none()
        );
        // Split with DataFusion's own reader factory, not with one of another type.
        let with_factory = |f: Arc<dyn ParquetFileReaderFactory>| {
            let (config, source) = plan
                .downcast_ref::<DataSourceExec>()
                .and_then(|e| e.downcast_to_file_source::<ParquetSource>())
                .expect("a Parquet scan");
            let mut config = config.clone();
            config.file_source = Arc::new(source.clone().with_parquet_file_reader_factory(f));
            DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
        };
        let store = ctx
            .runtime_env()
            .object_store(ObjectStoreUrl::local_filesystem())
            .unwrap();
        let own = with_factory(Arc::new(DefaultParquetFileReaderFactory::new(Arc::clone(
            &store,
        ))));
        assert!(
            split_scan(&own, 4, &ctx.task_ctx(), &reservation(&ctx))
                .await
                .is_some()
        );
        let custom = with_factory(Arc::new(CustomFactory(
            DefaultParquetFileReaderFactory::new(store),
        )));
        assert!(
            split_scan(&custom, 4, &ctx.task_ctx(), &reservation(&ctx))
                .await
                .is_none()
        );
        // Row groups enough for the pieces already.
        let many = dir.path().join("many.parquet");
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let data = batch(1_000, 8);
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&many).unwrap(),
            data.schema(),
            Some(props),
        )
        .unwrap();
        w.write(&data).unwrap();
        w.close().unwrap();
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
        let plan = scan(&ctx, &many).await;
        assert!(
            split_scan(&plan, 4, &ctx.task_ctx(), &reservation(&ctx))
                .await
                .is_none()
        );
    }

    /// A reader factory of the user's: reads as the default one does, under another type.
    #[derive(Debug)]
    pub(crate) struct CustomFactory(pub(crate) DefaultParquetFileReaderFactory);
    impl ParquetFileReaderFactory for CustomFactory {
        fn create_reader(
            &self,
            partition_index: usize,
            file: PartitionedFile,
            metadata_size_hint: Option<usize>,
            metrics: &datafusion::physical_plan::metrics::ExecutionPlanMetricsSet,
        ) -> Result<Box<dyn datafusion::parquet::arrow::async_reader::AsyncFileReader + Send>>
        {
            self.0
                .create_reader(partition_index, file, metadata_size_hint, metrics)
        }
    }

    #[test]
    fn unsplittable_versions_are_remembered_one_by_one() {
        let store = ObjectStoreUrl::parse("memory://remembered").unwrap();
        let version = |size: u64, seconds: u64| {
            let mut meta = PartitionedFile::new("x/unsplittable.parquet", size).object_meta;
            meta.last_modified += std::time::Duration::from_secs(seconds);
            meta
        };
        assert!(!unsplittable(&store, &version(10, 1), false));
        unsplittable(&store, &version(10, 1), true);
        assert!(unsplittable(&store, &version(10, 1), false));
        assert!(
            !unsplittable(&store, &version(10, 2), false),
            "another mtime"
        );
        assert!(
            !unsplittable(&store, &version(11, 1), false),
            "another size"
        );
        let other = ObjectStoreUrl::parse("memory://elsewhere").unwrap();
        assert!(
            !unsplittable(&other, &version(10, 1), false),
            "another store"
        );
    }

    #[test]
    fn zero_levels_of_rle_and_bit_packed_runs() {
        // RLE: 5 zeros, then 3 ones (width 1).
        assert_eq!(count_zero_levels(&[10, 0, 6, 1], 1, 8), Some((5, true)));
        // Bit-packed, one group of 8 (width 1): 0b1011_0010 -> values 0,1,0,0,1,1,0,1.
        assert_eq!(count_zero_levels(&[3, 0b1011_0010], 1, 8), Some((4, true)));
        // Only the first n count (the rest is padding).
        assert_eq!(count_zero_levels(&[3, 0b1111_1100], 1, 3), Some((2, true)));
        // A page that continues a row: the first level is not 0.
        assert_eq!(count_zero_levels(&[4, 1, 2, 0], 1, 3), Some((1, false)));
        // Width 2, bit-packed: values 0, 2, 1, 0, 3, 0, 0, 1 (2 bits each, LSB first).
        let v = [0u16, 2, 1, 0, 3, 0, 0, 1];
        let bits = v
            .iter()
            .enumerate()
            .fold(0u16, |a, (i, &x)| a | (x << (2 * i)));
        let packed = [3u8, bits as u8, (bits >> 8) as u8];
        assert_eq!(count_zero_levels(&packed, 2, 8), Some((4, true)));
        // Truncated input.
        assert_eq!(count_zero_levels(&[10], 1, 5), None);
        assert_eq!(count_zero_levels(&[3], 1, 8), None);
    }

    #[test]
    fn cut_points_cover_every_row_once_at_page_starts_or_the_shares() {
        let starts = [0, 10, 25, 40, 70, 90];
        for rows in [100, 1_000] {
            for want in 1..8 {
                let ranges = cuts(&starts, rows, want);
                assert!(ranges.len() <= want, "{rows} rows, {want} ranges");
                assert_eq!(ranges.first().unwrap().start, 0);
                assert_eq!(ranges.last().unwrap().end, rows);
                for (k, w) in ranges.windows(2).enumerate() {
                    assert_eq!(w[0].end, w[1].start);
                    // A page start, or the row where the share ends.
                    let target = (k + 1) * rows / want;
                    let cut = w[1].start;
                    assert!(
                        cut == target || starts.contains(&cut),
                        "{rows} rows, {want} ranges: cut {cut}, share ends at {target}"
                    );
                }
            }
        }
        // 40 is 10 rows from the middle of 100 rows, beyond 1/32 of a share (1 row), and the
        // page 40..70 is shorter than a share: cut inside it.
        assert_eq!(cuts(&starts, 100, 2), vec![0..50, 50..100]);
        // Within 1/32 of a share (20 <= 31): the page start.
        assert_eq!(
            cuts(&[0, 600, 1_020], 2_000, 2),
            vec![0..1_020, 1_020..2_000]
        );
        // The middle lies in a page longer than a share (90..1000): the nearest page start.
        assert_eq!(cuts(&starts, 1_000, 2), vec![0..90, 90..1_000]);
        // One page: never cut inside it (every task would decompress all of it).
        assert_eq!(cuts(&[0], 100, 4), vec![0..100]);
        // Pages of 10 rows, 4 shares of 25: cuts inside pages 20..30, 50..60 and 70..80.
        let tens: Vec<usize> = (0..100).step_by(10).collect();
        assert_eq!(cuts(&tens, 100, 4), vec![0..25, 25..50, 50..75, 75..100]);
        assert_eq!(cuts(&[0, 1, 2], 3, 8), vec![0..1, 1..2, 2..3]);
        assert_eq!(cuts(&starts, 100, 1), vec![0..100]);
    }

    /// Fuzzing the page walk with mutated real column chunks: bytes overwritten, bits
    /// flipped, chunks cut short, of files written with v1 and v2 pages. The walk never
    /// panics, and what it accepts is a consistent index: pages in file order within the
    /// chunk, first rows rising from 0 below the row count. `SETS_FUZZ_CASES` sets the
    /// number of mutated chunks (CI runs the default; a long run is a benchmark-style
    /// target: `SETS_FUZZ_CASES=200000 cargo test --release --lib page_walk_fuzz`).
    #[test]
    fn page_walk_fuzz() {
        let dir = tempfile::tempdir().unwrap();
        let mut chunks = Vec::new();
        for (i, version) in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0]
            .into_iter()
            .enumerate()
        {
            let path = dir.path().join(format!("f{i}.parquet"));
            write(&path, &batch(4_000, i as u64), false, version);
            let bytes = Bytes::from(std::fs::read(&path).unwrap());
            let meta = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
                .parse_and_finish(&bytes)
                .unwrap();
            for g in meta.row_groups() {
                for c in g.columns() {
                    let (start, len) = c.byte_range();
                    let chunk = bytes.slice(start as usize..(start + len) as usize);
                    // The unmutated chunk is located exactly.
                    let pages = locate_pages(
                        ChunkAt {
                            start,
                            bytes: chunk.clone(),
                        },
                        c,
                        g.num_rows(),
                    );
                    assert!(pages.is_some(), "{} v{i}", c.column_path());
                    chunks.push((start, chunk, c.clone(), g.num_rows()));
                }
            }
        }
        let cases: usize = std::env::var("SETS_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let mut rng = StdRng::seed_from_u64(0xF022);
        let mut accepted = 0;
        for case in 0..cases {
            let (start, chunk, column, rows) = &chunks[case % chunks.len()];
            let mut bytes = chunk.to_vec();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..bytes.len());
                match rng.random_range(0..4) {
                    0 => bytes[at] = rng.random(),
                    1 => bytes[at] ^= 1 << rng.random_range(0..8),
                    2 => bytes.truncate(at.max(1)),
                    _ => bytes[at] = [0x00, 0x7f, 0x80, 0xff][rng.random_range(0..4)],
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let located = locate_pages(
                ChunkAt {
                    start: *start,
                    bytes: Bytes::from(bytes.clone()),
                },
                column,
                *rows,
            );
            if let Some(pages) = located {
                accepted += 1;
                let end = *start as i64 + bytes.len() as i64;
                assert!(
                    pages.windows(2).all(|w| w[0].offset < w[1].offset
                        && w[0].first_row_index <= w[1].first_row_index)
                );
                assert!(pages.iter().all(|p| p.offset >= *start as i64
                    && p.offset + p.compressed_page_size as i64 <= end
                    && p.first_row_index < *rows));
                assert_eq!(pages[0].first_row_index, 0);
            }
        }
        // Most mutations hit page bodies, which the walk does not read: many are accepted.
        assert!(
            accepted > 0,
            "no mutated chunk was accepted in {cases} cases"
        );
        // Arbitrary bytes for the two decoders the walk rests on.
        for _ in 0..cases {
            let len = rng.random_range(0..64);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let _ = PageHeader::parse(&data);
            let _ = count_zero_levels(&data, rng.random_range(0..20), rng.random_range(0..5_000));
        }
    }

    #[test]
    fn malformed_page_headers_are_refused() {
        assert_eq!(PageHeader::parse(&[]), None);
        // A struct that never ends.
        assert_eq!(PageHeader::parse(&[0x15, 0x00]), None);
        // An unknown field 15 holding a map of 2^62 bool pairs in 11 bytes, or a list of
        // 2^62 bytes: refused at once (the fuzzer's hang: bools of a map took no bytes).
        let map = [
            0xfb, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x11, 0x00,
        ];
        assert_eq!(PageHeader::parse(&map), None);
        let list = [
            0xf9, 0xf3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x00,
        ];
        assert_eq!(PageHeader::parse(&list), None);
        // type = DATA_PAGE (0), compressed size = -1: refused.
        assert_eq!(PageHeader::parse(&[0x15, 0x00, 0x25, 0x01, 0x00]), None);
        // type 0, uncompressed 4, compressed 4, then stop.
        let (h, len) = PageHeader::parse(&[0x15, 0x00, 0x15, 0x08, 0x15, 0x08, 0x00]).unwrap();
        assert_eq!((h.page_type, h.compressed_size, len), (DATA_PAGE, 4, 7));
    }
}
