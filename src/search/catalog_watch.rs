//! A session's catalog, watched: when a table is dropped or replaced (`DROP TABLE`,
//! `CREATE OR REPLACE`, `deregister_table`), the index loaded from it is released at once
//! instead of at the next search. Every call is passed through to the catalog it wraps.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::common::Result;
use datafusion::logical_expr::TableType;

use super::loaded::evict_table;

/// `inner`, watched (returned as is when it already is).
pub fn watch_catalogs(inner: Arc<dyn CatalogProviderList>) -> Arc<dyn CatalogProviderList> {
    if (inner.as_ref() as &dyn Any).is::<WatchedCatalogs>() {
        return inner;
    }
    Arc::new(WatchedCatalogs(inner))
}

fn released(old: Result<Option<Arc<dyn TableProvider>>>) -> Result<Option<Arc<dyn TableProvider>>> {
    if let Ok(Some(t)) = &old {
        evict_table(t);
    }
    old
}

#[derive(Debug)]
struct WatchedCatalogs(Arc<dyn CatalogProviderList>);

impl CatalogProviderList for WatchedCatalogs {
    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.0.register_catalog(name, catalog)
    }
    fn catalog_names(&self) -> Vec<String> {
        self.0.catalog_names()
    }
    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let c = self.0.catalog(name)?;
        Some(Arc::new(WatchedCatalog(c)))
    }
}

#[derive(Debug)]
struct WatchedCatalog(Arc<dyn CatalogProvider>);

impl CatalogProvider for WatchedCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.0.schema_names()
    }
    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let s = self.0.schema(name)?;
        Some(Arc::new(WatchedSchema(s)))
    }
    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.0.register_schema(name, schema)
    }
    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.0.deregister_schema(name, cascade)
    }
}

#[derive(Debug)]
struct WatchedSchema(Arc<dyn SchemaProvider>);

#[async_trait]
impl SchemaProvider for WatchedSchema {
    fn owner_name(&self) -> Option<&str> {
        self.0.owner_name()
    }
    fn table_names(&self) -> Vec<String> {
        self.0.table_names()
    }
    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.0.table(name).await
    }
    async fn table_type(&self, name: &str) -> Result<Option<TableType>> {
        self.0.table_type(name).await
    }
    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        released(self.0.register_table(name, table))
    }
    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        released(self.0.deregister_table(name))
    }
    fn table_exist(&self, name: &str) -> bool {
        self.0.table_exist(name)
    }
}
