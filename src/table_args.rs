//! Arguments of the crate's table functions: literals (possibly negated or cast), strings,
//! integers and table names resolved in the session's catalog, with errors that name the
//! function, the argument's position and what it is for.

use std::sync::Arc;

use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Result, ScalarValue, TableReference, plan_datafusion_err, plan_err};
use datafusion::logical_expr::Expr;
use futures::FutureExt;

/// The constant value of a literal, possibly negated or cast.
pub fn literal(expr: &Expr) -> Option<ScalarValue> {
    match expr {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Negative(inner) => literal(inner)?.arithmetic_negate().ok(),
        Expr::Cast(c) => literal(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => literal(&c.expr)?.cast_to(c.field.data_type()).ok(),
        _ => None,
    }
}

/// Argument `k` (0-based) of `who`, a non-NULL string literal.
pub fn string_arg(who: &str, exprs: &[Expr], k: usize, what: &str) -> Result<String> {
    let n = k + 1;
    match exprs.get(k).and_then(literal) {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Ok(s),
        Some(v) if v.is_null() => plan_err!("{who}: argument {n} ({what}) must not be NULL"),
        _ => plan_err!(
            "{who}: argument {n} ({what}) must be a string literal, got {}",
            exprs.get(k).map(|e| e.to_string()).unwrap_or_default()
        ),
    }
}

/// Argument `k` (0-based) of `who`, a non-NULL integer literal.
pub fn int_arg(who: &str, exprs: &[Expr], k: usize, what: &str) -> Result<i64> {
    let n = k + 1;
    match exprs.get(k).and_then(literal) {
        Some(v) if v.is_null() => plan_err!("{who}: argument {n} ({what}) must not be NULL"),
        Some(v) if v.data_type().is_integer() => {
            match v.cast_to(&datafusion::arrow::datatypes::DataType::Int64) {
                Ok(ScalarValue::Int64(Some(i))) => Ok(i),
                _ => plan_err!("{who}: argument {n} ({what}) is out of range: {v}"),
            }
        }
        _ => plan_err!("{who}: argument {n} ({what}) must be an integer literal"),
    }
}

/// Look a table up in the session's catalog (`schema.table` and `catalog.schema.table`
/// allowed), for planning code that cannot wait. A catalog that answers asynchronously (the
/// CLI's, which may open files by name, or a remote one) is waited for on a multi-threaded
/// Tokio runtime; on a current-thread runtime such a table is an error.
pub fn resolve_table(
    who: &str,
    session: &dyn Session,
    name: &str,
    arg: usize,
) -> Result<Arc<dyn TableProvider>> {
    let fut = resolve_table_async(who, session, name, arg);
    let mut fut = std::pin::pin!(fut);
    if let Some(r) = (&mut fut).now_or_never() {
        return r;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(fut))
        }
        _ => plan_err!(
            "{who}: argument {arg} (table): table '{name}' lives in a catalog that cannot be read synchronously here"
        ),
    }
}

/// [`resolve_table`] for code that can wait.
pub async fn resolve_table_async(
    who: &str,
    session: &dyn Session,
    name: &str,
    arg: usize,
) -> Result<Arc<dyn TableProvider>> {
    let options = session.config_options();
    let resolved = TableReference::from(name).resolve(
        &options.catalog.default_catalog,
        &options.catalog.default_schema,
    );
    let not_found =
        || plan_datafusion_err!("{who}: argument {arg} (table): table '{name}' not found");
    let catalog = session
        .catalog_list()
        .catalog(&resolved.catalog)
        .ok_or_else(not_found)?;
    let schema = catalog.schema(&resolved.schema).ok_or_else(not_found)?;
    match schema.table(&resolved.table).await {
        Ok(Some(table)) => Ok(table),
        Ok(None) => Err(not_found()),
        // The CLI's catalog tries a missing name as a file path and fails with an I/O error.
        Err(e) => Err(plan_datafusion_err!(
            "{who}: argument {arg} (table): table '{name}' not found ({e})"
        )),
    }
}
