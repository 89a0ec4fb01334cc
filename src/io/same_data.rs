//! Whether two scans provably produce the same rows: the identity by which the similarity
//! join tells a self-join and the search tells that an index table is unchanged.
//!
//! In-memory batches match buffer for buffer, files by the identity DataFusion's own caches
//! use (location, size, modification time, e-tag, version). Holding a plan keeps its batches
//! alive, so a later plan can never show a reused address as the same data.

use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::{DataSource, DataSourceExec};
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
    if let (Some(pa), Some(pb)) = (
        a.downcast_ref::<ProjectionExec>(),
        b.downcast_ref::<ProjectionExec>(),
    ) {
        return pa.expr().len() == pb.expr().len()
            && pa
                .expr()
                .iter()
                .zip(pb.expr())
                .all(|(x, y)| x.expr.eq(&y.expr) && !is_volatile(&x.expr))
            && same_rows(pa.input(), pb.input(), by_address);
    }
    if let (Some(fa), Some(fb)) = (
        a.downcast_ref::<FilterExec>(),
        b.downcast_ref::<FilterExec>(),
    ) {
        return fa.fetch().is_none()
            && fb.fetch().is_none()
            && fa.predicate() == fb.predicate()
            && !is_volatile(fa.predicate())
            && fa.projection() == fb.projection()
            && same_rows(fa.input(), fb.input(), by_address);
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
    let (Some(da), Some(db)) = (
        a.downcast_ref::<DataSourceExec>(),
        b.downcast_ref::<DataSourceExec>(),
    ) else {
        return false;
    };
    let (sa, sb) = (da.data_source(), db.data_source());
    if let (Some(ma), Some(mb)) = (
        sa.downcast_ref::<MemorySourceConfig>(),
        sb.downcast_ref::<MemorySourceConfig>(),
    ) {
        return same_batches(ma, mb, true);
    }
    if let (Some(fa), Some(fb)) = (
        sa.downcast_ref::<FileScanConfig>(),
        sb.downcast_ref::<FileScanConfig>(),
    ) {
        return same_files(fa, fb, true);
    }
    false
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
        && pa.iter().zip(pb).all(|(xa, xb)| {
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
    let (sa, sb) = (&a.file_source, &b.file_source);
    let files_match = a.file_groups.len() == b.file_groups.len()
        && a.file_groups.iter().zip(&b.file_groups).all(|(ga, gb)| {
            ga.len() == gb.len()
                && ga.iter().zip(gb.iter()).all(|(x, y)| {
                    x.object_meta == y.object_meta
                        && x.range == y.range
                        && x.partition_values == y.partition_values
                        && x.extensions.is_empty()
                        && y.extensions.is_empty()
                })
        });
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
    files_match
        && readers_match
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
