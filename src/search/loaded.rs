//! Index tables loaded into memory, cached per table provider.
//!
//! `topk_bm25` reads an index table (a `CREATE TABLE ... AS SELECT * FROM bm25_index(...)`
//! memory table, or a Parquet file registered as a table) once, builds the in-memory
//! [`InvertedIndex`], and keeps it for later queries while the table provider lives:
//! replacing or dropping the table makes the next query load the new one. The memory is
//! reserved in the session's `MemoryPool` for as long as the index is cached.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::collect;

use super::index::InvertedIndex;
use super::scoring::{Bm25Params, Scored};
use crate::catalog::resolve_table_async;

/// A loaded index and the impacts of the parameter sets it was queried with.
#[derive(Debug)]
pub struct LoadedIndex {
    pub index: InvertedIndex,
    scored: Mutex<HashMap<[u64; 3], Arc<Scored>>>,
    reservation: Mutex<MemoryReservation>,
}

impl LoadedIndex {
    /// The impacts for `params`, computed on first use and kept.
    pub fn scored(&self, params: Bm25Params) -> Result<Arc<Scored>> {
        let key = [
            params.k1.to_bits(),
            params.b.to_bits(),
            params.alpha.to_bits(),
        ];
        if let Some(s) = self.scored.lock().unwrap().get(&key) {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Scored::new(&self.index, params));
        let bytes = s.impacts.len() * 8 + s.block_max.len() * 8 + s.weighted_static.len() * 8;
        self.reservation.lock().unwrap().try_grow(bytes)?;
        let mut map = self.scored.lock().unwrap();
        Ok(Arc::clone(map.entry(key).or_insert(s)))
    }
}

struct Entry {
    table: Weak<dyn TableProvider>,
    loaded: Arc<LoadedIndex>,
}

/// Keyed by the provider's address; a `Weak` keeps the address from being reused while the
/// entry exists, and entries whose provider is gone are dropped at the next lookup.
static CACHE: LazyLock<Mutex<HashMap<usize, Entry>>> = LazyLock::new(Default::default);

/// The index in table `name`, loaded (or from the cache). `who` names the caller in errors;
/// `arg` is the table argument's position.
pub async fn load_index(
    session: &dyn Session,
    name: &str,
    who: &str,
    arg: usize,
) -> Result<Arc<LoadedIndex>> {
    let table = resolve_table_async(who, session, name, arg).await?;
    let key = Arc::as_ptr(&table) as *const () as usize;
    {
        let mut cache = CACHE.lock().unwrap();
        cache.retain(|_, e| e.table.strong_count() > 0);
        if let Some(e) = cache.get(&key) {
            return Ok(Arc::clone(&e.loaded));
        }
    }
    let plan = table.scan(session, None, &[], None).await?;
    let batches = collect(plan, session.task_ctx()).await?;
    let index = InvertedIndex::from_batches(&batches, who, name)?;
    drop(batches);
    let reservation = MemoryConsumer::new(format!("{who} index '{name}'"))
        .register(&session.runtime_env().memory_pool);
    reservation.try_grow(index.size_bytes())?;
    let loaded = Arc::new(LoadedIndex {
        index,
        scored: Mutex::new(HashMap::new()),
        reservation: Mutex::new(reservation),
    });
    let mut cache = CACHE.lock().unwrap();
    let e = cache.entry(key).or_insert(Entry {
        table: Arc::downgrade(&table),
        loaded,
    });
    Ok(Arc::clone(&e.loaded))
}
