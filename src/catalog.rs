//! Table lookups in a session's catalog for the crate's table functions and the index
//! loader, with errors that name the function and the argument.

use std::sync::Arc;

use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Result, TableReference, plan_datafusion_err, plan_err};
use futures::FutureExt;

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
