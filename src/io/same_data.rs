//! Whether two scans provably produce the same rows: the identity by which the similarity
//! join tells a self-join and the search tells that an index table is unchanged.
//!
//! In-memory batches match buffer for buffer, files by the identity DataFusion's own caches
//! use (location, size, modification time, e-tag, version). Holding a plan keeps its batches
//! alive, so a later plan can never show a reused address as the same data.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::object_store::ObjectMeta;
use datafusion::object_store::path::Path;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use super::parquet_split::datafusion_reader_factory;

/// Whether `a` and `b` provably produce the same rows (as a multiset): the same plan node
/// with nothing volatile and no limit below it (executed once for both sides instead of
/// twice); scans of the very same in-memory batches (buffer for buffer); scans of the same files
/// (see [`same_files`]); or equal deterministic projections or filters, or repartitions, over
/// inputs that produce the same rows. Anything else is not proved, and the join stays an R-S join.
pub fn same_data(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> bool {
    same_rows(a, b, true)
}

/// Whether `a` and `b` read the same version of the same data, proved by structure alone
/// (two scans of one table planned at different times): [`same_data`] without its shortcut
/// for one plan node met twice.
pub fn same_version(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>) -> bool {
    same_rows(a, b, false)
}

/// Whether [`same_data`] can ever prove that another plan reads what `plan` does: its
/// leaves are in-memory batches or files, under deterministic projections, filters and
/// repartitions only.
pub fn has_identity(plan: &Arc<dyn ExecutionPlan>) -> bool {
    same_rows(plan, plan, false)
}

/// Whether every leaf of `plan` is a scan of in-memory batches (which its table holds:
/// reading them allocates nothing new).
pub fn only_memory(plan: &Arc<dyn ExecutionPlan>) -> bool {
    match plan.children().as_slice() {
        [] => plan.downcast_ref::<DataSourceExec>().is_some_and(|d| {
            d.data_source()
                .downcast_ref::<MemorySourceConfig>()
                .is_some()
        }),
        children => children.iter().all(|c| only_memory(c)),
    }
}

/// [`same_data`]; `by_address`: one plan node met twice is proved by being repeatable.
fn same_rows(a: &Arc<dyn ExecutionPlan>, b: &Arc<dyn ExecutionPlan>, by_address: bool) -> bool {
    if by_address && Arc::ptr_eq(a, b) {
        return repeatable(a);
    }
    if a.schema() != b.schema() {
        return false;
    }
    if let Some(inputs) = same_row_map(a, b) {
        return inputs.is_some_and(|(ia, ib)| same_rows(ia, ib, by_address));
    }
    // Moving rows between partitions keeps the multiset.
    let regroups = |p: &Arc<dyn ExecutionPlan>| {
        p.downcast_ref::<RepartitionExec>().is_some()
            || p.downcast_ref::<CoalescePartitionsExec>()
                .is_some_and(|c| c.fetch().is_none())
    };
    if regroups(a) && regroups(b) && a.name() == b.name() {
        return same_rows(a.children()[0], b.children()[0], by_address);
    }
    match sources(a, b) {
        Some(Sources::Memory(ma, mb)) => same_batches(ma, mb, true),
        Some(Sources::Files(fa, fb)) => same_files(fa, fb, true),
        None => false,
    }
}

/// Two scans' sources of one kind.
enum Sources<'a> {
    Memory(&'a MemorySourceConfig, &'a MemorySourceConfig),
    Files(&'a FileScanConfig, &'a FileScanConfig),
}

/// The sources of `a` and `b` when both are scans of in-memory batches or both of files.
fn sources<'a>(
    a: &'a Arc<dyn ExecutionPlan>,
    b: &'a Arc<dyn ExecutionPlan>,
) -> Option<Sources<'a>> {
    let (da, db) = (
        a.downcast_ref::<DataSourceExec>()?,
        b.downcast_ref::<DataSourceExec>()?,
    );
    let (sa, sb) = (da.data_source(), db.data_source());
    if let (Some(ma), Some(mb)) = (
        sa.downcast_ref::<MemorySourceConfig>(),
        sb.downcast_ref::<MemorySourceConfig>(),
    ) {
        return Some(Sources::Memory(ma, mb));
    }
    let (fa, fb) = (
        sa.downcast_ref::<FileScanConfig>()?,
        sb.downcast_ref::<FileScanConfig>()?,
    );
    Some(Sources::Files(fa, fb))
}

/// The inputs of two plan nodes.
type Inputs<'a> = (&'a Arc<dyn ExecutionPlan>, &'a Arc<dyn ExecutionPlan>);

/// When `a` and `b` are both projections or both filters: whether they map each row alike
/// (equal deterministic expressions, no limit), as their inputs if so (`Some(None)` when
/// not). Neither moves rows between partitions, so partition `p` of either holds the mapped
/// rows of its input's partition `p`. `None` for any other pair of nodes.
fn same_row_map<'a>(
    a: &'a Arc<dyn ExecutionPlan>,
    b: &'a Arc<dyn ExecutionPlan>,
) -> Option<Option<Inputs<'a>>> {
    if let (Some(pa), Some(pb)) = (
        a.downcast_ref::<ProjectionExec>(),
        b.downcast_ref::<ProjectionExec>(),
    ) {
        let alike = pa.expr().len() == pb.expr().len()
            && pa
                .expr()
                .iter()
                .zip(pb.expr())
                .all(|(x, y)| x.expr.eq(&y.expr) && !is_volatile(&x.expr));
        return Some(alike.then_some((pa.input(), pb.input())));
    }
    if let (Some(fa), Some(fb)) = (
        a.downcast_ref::<FilterExec>(),
        b.downcast_ref::<FilterExec>(),
    ) {
        let alike = fa.fetch().is_none()
            && fb.fetch().is_none()
            && fa.predicate() == fb.predicate()
            && !is_volatile(fa.predicate())
            && fa.projection() == fb.projection();
        return Some(alike.then_some((fa.input(), fb.input())));
    }
    None
}

/// Whether partition `pa` of `a` and partition `pb` of `b` provably hold the same rows, each
/// judged alone (the plans may group their data into other partitions): the same projections
/// and filters over scans whose partitions read exactly their own share, with the same share
/// at `pa` and `pb`. In memory: the very same batches. From files: the same files (as
/// [`same_files`] tells them) in the two groups, and scans equal but for their other groups,
/// where DataFusion never moves a file to another partition (the scan is partitioned by its
/// file groups, keeps an order, or has one partition). A datafusion-distributed task's scan
/// is its slice of the table's groups: a worker finds a group loaded under any task.
pub fn same_partition(
    a: &Arc<dyn ExecutionPlan>,
    pa: usize,
    b: &Arc<dyn ExecutionPlan>,
    pb: usize,
) -> bool {
    if a.schema() != b.schema() {
        return false;
    }
    if let Some(inputs) = same_row_map(a, b) {
        return inputs.is_some_and(|(ia, ib)| same_partition(ia, pa, ib, pb));
    }
    let (fa, fb) = match sources(a, b) {
        Some(Sources::Memory(ma, mb)) => {
            return ma.fetch().is_none()
                && mb.fetch().is_none()
                && ma.projection() == mb.projection()
                && ma
                    .partitions()
                    .get(pa)
                    .zip(mb.partitions().get(pb))
                    .is_some_and(|(xa, xb)| same_batch_list(xa, xb));
        }
        Some(Sources::Files(fa, fb)) => (fa, fb),
        None => return false,
    };
    // A file of a partition may be read by another one (work stealing) unless one of these
    // holds (`FileScanConfig::create_sibling_state`).
    let own = |f: &FileScanConfig| {
        f.output_partitioning.is_some() || f.preserve_order || f.file_groups.len() == 1
    };
    let (Some(ga), Some(gb)) = (fa.file_groups.get(pa), fb.file_groups.get(pb)) else {
        return false;
    };
    own(fa) && own(fb) && same_group(ga, gb) && same_scan(fa, fb, true)
}

/// Whether `old` (with `partition`: only that partition of a scan that reads its own file
/// group, as [`same_partition`] judges it) reads a file that `new` reads too (the same
/// location in the same object store) in another version (size, modification time, e-tag or
/// version): the file has been rewritten between the two plans, so nothing kept from `old`'s
/// read of it can be found again.
pub fn reads_replaced_file(
    old: &Arc<dyn ExecutionPlan>,
    partition: Option<usize>,
    new: &Arc<dyn ExecutionPlan>,
) -> bool {
    fn files<'a>(
        plan: &'a Arc<dyn ExecutionPlan>,
        partition: Option<usize>,
        out: &mut Vec<(&'a str, &'a ObjectMeta)>,
    ) {
        let children = plan.children();
        if children.is_empty() {
            let scan = plan.downcast_ref::<DataSourceExec>();
            if let Some(config) =
                scan.and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
            {
                let store = config.object_store_url.as_str();
                let groups = match partition {
                    Some(p) => config.file_groups.get(p..=p).unwrap_or_default(),
                    None => &config.file_groups,
                };
                out.extend(
                    (groups.iter())
                        .flat_map(|g| g.iter())
                        .map(|f| (store, &f.object_meta)),
                );
            }
        }
        for child in children {
            files(child, partition, out);
        }
    }
    let (mut was, mut now) = (Vec::new(), Vec::new());
    files(old, partition, &mut was);
    files(new, None, &mut now);
    let now: HashMap<(&str, &Path), &ObjectMeta> = now
        .into_iter()
        .map(|(store, meta)| ((store, &meta.location), meta))
        .collect();
    was.into_iter().any(|(store, meta)| {
        now.get(&(store, &meta.location))
            .is_some_and(|current| *current != meta)
    })
}

/// Whether executing `plan` twice gives the same rows: no node below it holds a volatile
/// expression or a limit (a limit over several partitions keeps whichever rows come first).
fn repeatable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut volatile = false;
    let walked = plan.apply_expressions(&mut |e| {
        volatile |= is_volatile(e);
        Ok(match volatile {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    walked.is_ok()
        && !volatile
        && plan.fetch().is_none()
        && plan.children().into_iter().all(repeatable)
}

/// Both scan the very same in-memory batches with no limit (and the same projection, with
/// `projection`).
pub fn same_batches(a: &MemorySourceConfig, b: &MemorySourceConfig, projection: bool) -> bool {
    let (pa, pb) = (a.partitions(), b.partitions());
    a.fetch().is_none()
        && b.fetch().is_none()
        && (!projection || a.projection() == b.projection())
        && pa.len() == pb.len()
        && pa.iter().zip(pb).all(|(xa, xb)| same_batch_list(xa, xb))
}

/// The very same batches, buffer for buffer, in the same order.
fn same_batch_list(xa: &[RecordBatch], xb: &[RecordBatch]) -> bool {
    xa.len() == xb.len()
        && xa.iter().zip(xb).all(|(ba, bb)| {
            ba.num_rows() == bb.num_rows()
                && ba.num_columns() == bb.num_columns()
                && ba
                    .columns()
                    .iter()
                    .zip(bb.columns())
                    .all(|(ca, cb)| ca.to_data().ptr_eq(&cb.to_data()))
        })
}

/// Both scan the same versions of the same files the same way: one object store, the same
/// files in the same groups (each with the same location, size, modification time, e-tag and
/// version, byte range and partition values: the identity by which DataFusion's own caches
/// tell a file version), one format, table schema, projection and pushed-down predicate (none
/// volatile), no limit and no adapter that could rewrite values. The self-join then reads the
/// files once, where the nested loop would have read them twice. (`projection`: `false`
/// leaves the projections to the caller.)
pub fn same_files(a: &FileScanConfig, b: &FileScanConfig, projection: bool) -> bool {
    a.file_groups.len() == b.file_groups.len()
        && a.file_groups
            .iter()
            .zip(&b.file_groups)
            .all(|(ga, gb)| same_group(ga, gb))
        && same_scan(a, b, projection)
}

/// The same files in the same order, each the same version with the same byte range and
/// partition values.
fn same_group(ga: &FileGroup, gb: &FileGroup) -> bool {
    ga.len() == gb.len()
        && ga.iter().zip(gb.iter()).all(|(x, y)| {
            x.object_meta == y.object_meta
                && x.range == y.range
                && x.partition_values == y.partition_values
                && x.extensions.is_empty()
                && y.extensions.is_empty()
        })
}

/// [`same_files`] but for the file groups: every other setting of the two scans that decides
/// what a file's rows become.
fn same_scan(a: &FileScanConfig, b: &FileScanConfig, projection: bool) -> bool {
    let (sa, sb) = (&a.file_source, &b.file_source);
    let filter = sa.filter();
    // Parquet read through a reader factory of the user's may read anything: only the same one
    // on both sides, or DataFusion's own.
    let parquet = |s: &Arc<dyn FileSource>| {
        s.downcast_ref::<ParquetSource>()
            .and_then(|p| p.parquet_file_reader_factory().cloned())
    };
    let readers_match = match (parquet(sa), parquet(sb)) {
        (Some(x), Some(y)) => {
            Arc::ptr_eq(&x, &y)
                || (datafusion_reader_factory(x.as_ref()) && datafusion_reader_factory(y.as_ref()))
        }
        (x, y) => {
            x.is_none_or(|x| datafusion_reader_factory(x.as_ref()))
                && y.is_none_or(|y| datafusion_reader_factory(y.as_ref()))
        }
    };
    readers_match
        && a.object_store_url == b.object_store_url
        && a.limit.is_none()
        && b.limit.is_none()
        && a.file_compression_type == b.file_compression_type
        && a.expr_adapter_factory.is_none()
        && b.expr_adapter_factory.is_none()
        && sa.file_type() == sb.file_type()
        && sa.table_schema().table_schema() == sb.table_schema().table_schema()
        && (!projection || sa.projection() == sb.projection())
        && filter == sb.filter()
        && !filter.as_ref().is_some_and(is_volatile)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::FileScanConfigBuilder;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::physical_expr::expressions::{Column, lit};
    use datafusion::physical_plan::Partitioning;

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]))
    }

    /// A Parquet scan of `groups` (file names), partitioned by its groups when `own`.
    fn files(groups: &[&[&str]], own: bool) -> Arc<dyn ExecutionPlan> {
        let groups = groups
            .iter()
            .map(|g| {
                FileGroup::new(
                    g.iter()
                        .map(|name| PartitionedFile::new(format!("shards/{name}"), 100))
                        .collect(),
                )
            })
            .collect::<Vec<_>>();
        let by_group = Partitioning::UnknownPartitioning(groups.len());
        let config = FileScanConfigBuilder::new(
            ObjectStoreUrl::local_filesystem(),
            Arc::new(ParquetSource::new(schema())),
        )
        .with_file_groups(groups)
        .with_output_partitioning(own.then_some(by_group))
        .build();
        DataSourceExec::from_data_source(config)
    }

    fn batch(v: i64) -> RecordBatch {
        RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    }

    #[test]
    fn a_partition_is_the_same_as_another_slicing_s_partition_of_its_own_files() {
        // Three shards as one task of three partitions, and sliced over two tasks (a
        // datafusion-distributed worker's share): partition 1 of the first is partition 0
        // of the second task's slice.
        let whole = files(&[&["a"], &["b"], &["c"]], true);
        let slice = files(&[&["b"], &["c"]], true);
        assert!(same_partition(&whole, 1, &slice, 0));
        assert!(same_partition(&whole, 2, &slice, 1));
        assert!(!same_partition(&whole, 0, &slice, 0), "other files");
        assert!(!same_partition(&whole, 3, &slice, 0), "no such partition");
        assert!(!same_partition(&whole, 1, &files(&[&["b", "c"]], true), 0));
        // Groups DataFusion may rebalance at run time (work stealing): no partition is its
        // own, except a scan's only one.
        let stealing = files(&[&["a"], &["b"], &["c"]], false);
        assert!(!same_partition(&stealing, 1, &slice, 0));
        assert!(!same_partition(&stealing, 1, &stealing, 1));
        let one = files(&[&["a", "b"]], false);
        assert!(same_partition(&one, 0, &files(&[&["a", "b"]], true), 0));
        // The same filters above, and not other ones.
        let filter = |input: &Arc<dyn ExecutionPlan>, v: i64| {
            let p = Arc::new(datafusion::physical_plan::expressions::BinaryExpr::new(
                Arc::new(Column::new("x", 0)),
                datafusion::logical_expr::Operator::Gt,
                lit(v),
            ));
            Arc::new(FilterExec::try_new(p, Arc::clone(input)).unwrap()) as Arc<dyn ExecutionPlan>
        };
        assert!(same_partition(&filter(&whole, 1), 1, &filter(&slice, 1), 0));
        assert!(!same_partition(
            &filter(&whole, 1),
            1,
            &filter(&slice, 2),
            0
        ));
        assert!(!same_partition(&filter(&whole, 1), 1, &slice, 0));
        // A repartition mixes every input partition into each of its own.
        let hashed = Arc::new(
            RepartitionExec::try_new(
                Arc::clone(&whole),
                Partitioning::Hash(vec![Arc::new(Column::new("x", 0))], 3),
            )
            .unwrap(),
        ) as Arc<dyn ExecutionPlan>;
        assert!(!same_partition(&hashed, 1, &hashed, 1));
    }

    #[test]
    fn a_memory_partition_is_the_same_only_as_the_very_same_batches() {
        let (b1, b2) = (batch(1), batch(2));
        let scan = |parts: Vec<Vec<RecordBatch>>| {
            MemorySourceConfig::try_new_exec(&parts, schema(), None).unwrap()
                as Arc<dyn ExecutionPlan>
        };
        let a = scan(vec![vec![b1.clone()], vec![b2.clone()]]);
        let b = scan(vec![vec![b2.clone()]]);
        assert!(same_partition(&a, 1, &b, 0));
        assert!(!same_partition(&a, 0, &b, 0));
        assert!(
            !same_partition(&a, 1, &scan(vec![vec![batch(2)]]), 0),
            "a copy"
        );
        assert!(!same_partition(&a, 2, &b, 0));
    }

    #[test]
    fn a_file_read_in_another_version_is_replaced() {
        // `files` sizes every file 100 bytes; the same names at another size are the files
        // rewritten.
        let resized = |groups: &[&[&str]], size: u64| {
            let groups = (groups.iter())
                .map(|g| {
                    FileGroup::new(
                        (g.iter())
                            .map(|name| PartitionedFile::new(format!("shards/{name}"), size))
                            .collect(),
                    )
                })
                .collect::<Vec<_>>();
            let config = FileScanConfigBuilder::new(
                ObjectStoreUrl::local_filesystem(),
                Arc::new(ParquetSource::new(schema())),
            )
            .with_file_groups(groups)
            .build();
            DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
        };
        let old = files(&[&["a"], &["b"]], true);
        assert!(!reads_replaced_file(&old, None, &old), "the same version");
        assert!(!reads_replaced_file(&old, None, &resized(&[&["a"]], 100)));
        assert!(reads_replaced_file(&old, None, &resized(&[&["b"]], 101)));
        assert!(reads_replaced_file(
            &old,
            None,
            &resized(&[&["c"], &["a"]], 7)
        ));
        assert!(
            !reads_replaced_file(&old, None, &resized(&[&["c"]], 7)),
            "other files"
        );
        // Below a filter too, and never for batches in memory.
        let filtered = Arc::new(FilterExec::try_new(lit(true), resized(&[&["a", "b"]], 5)).unwrap())
            as Arc<dyn ExecutionPlan>;
        assert!(reads_replaced_file(&old, None, &filtered));
        let memory = MemorySourceConfig::try_new_exec(&[vec![batch(1)]], schema(), None).unwrap()
            as Arc<dyn ExecutionPlan>;
        assert!(!reads_replaced_file(&old, None, &memory));
        // One partition of its own group: only that group's files count.
        assert!(reads_replaced_file(&old, Some(1), &resized(&[&["b"]], 101)));
        assert!(!reads_replaced_file(
            &old,
            Some(0),
            &resized(&[&["b"]], 101)
        ));
        assert!(!reads_replaced_file(
            &old,
            Some(2),
            &resized(&[&["b"]], 101)
        ));
        assert!(!reads_replaced_file(&memory, None, &old));
    }
}
