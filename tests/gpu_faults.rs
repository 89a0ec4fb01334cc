//! Every GPU failure against every GPU entry point (`src/backend/gpu/fault.rs`): no driver,
//! no NVRTC, no device, an NVRTC compile error (at the backend's start and, after it, when a
//! later kernel family compiles), device and pinned memory exhausted, and a kernel that
//! faults — each injected into `list_intersect` / `list_intersect_count`, `topk_bm25` and
//! `similarity_join` run with `sets.backend = 'gpu'` and `'auto'`. Every query must return
//! exactly what `sets.backend = 'cpu'` returns, with no error, panic or hang; where a GPU is
//! present (the device run, `scripts/gpu/run.sh`) the test also checks what the backend
//! made of the fault: the start-up faults leave it off with the right reason (in `EXPLAIN`
//! too), memory faults leave it usable once they stop, a kernel fault turns it off for the
//! process.
//!
//! The backend starts once per process and a kernel fault loses the context for good, so
//! each (fault, workload) pair runs in a child process of this test binary (the ignored
//! test `child`, driven by environment variables), under a time limit.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use datafusion_sets::backend::gpu::{self, GpuError, fault::Fault};
use datafusion_sets::new_context;

const CHILD: &str = "DFSETS_FAULT_CHILD";
const WORKLOAD: &str = "DFSETS_FAULT_WORKLOAD";
/// A fault to arm only after the backend has started (`fault::arm`).
const LATE: &str = "DFSETS_FAULT_LATE";
/// "1" when the parent found a usable GPU.
const HAS_GPU: &str = "DFSETS_FAULT_HAS_GPU";
/// Set in the children of the kernel cache's test.
const CACHE_CHILD: &str = "DFSETS_CACHE_CHILD";
const WORKLOADS: [&str; 3] = ["intersect", "bm25", "simjoin"];
/// Far above a child's run (about a second without a GPU, a few with one).
const CHILD_LIMIT: Duration = Duration::from_secs(300);

#[test]
fn every_fault_ends_on_the_cpu_with_the_same_answer() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CACHE_CHILD).is_some() {
        return;
    }
    let has_gpu = gpu::device().is_ok();
    println!("gpu_faults: GPU present: {has_gpu}");
    if std::env::var("DFSETS_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        assert!(
            has_gpu,
            "DFSETS_REQUIRE_GPU=1 but no usable GPU: {:?}",
            gpu::device()
        );
    }
    let exe = std::env::current_exe().expect("test binary path");
    let mut runs: Vec<(String, Option<Fault>, &str)> = Vec::new();
    for f in Fault::ALL {
        for w in WORKLOADS {
            runs.push((f.name().to_string(), None, w));
        }
    }
    for w in ["bm25", "simjoin"] {
        runs.push((String::new(), Some(Fault::Compile), w));
    }
    let mut failures = Vec::new();
    for (env_faults, late, workload) in &runs {
        let label = match late {
            Some(f) => format!("{} (armed after start) / {workload}", f.name()),
            None => format!("{env_faults} / {workload}"),
        };
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "child", "--ignored", "--nocapture"])
            .env(CHILD, "1")
            .env(WORKLOAD, workload)
            .env(HAS_GPU, if has_gpu { "1" } else { "0" })
            .env("DFSETS_GPU_FAULT", env_faults)
            .env_remove("DFSETS_DISABLE_GPU");
        if let Some(f) = late {
            cmd.env(LATE, f.name());
        }
        let (status, out, err, secs) = wait_for(cmd);
        match status {
            Some(s) if s.success() && out.contains("child: done") => {
                let state = out
                    .lines()
                    .find_map(|l| l.strip_prefix("child: backend after the workload: "))
                    .unwrap_or("?");
                println!("gpu_faults: {label}: ok in {secs:.1} s; backend then: {state}");
            }
            Some(s) => failures.push(format!("{label}: {s}\n{out}\n{err}")),
            None => failures.push(format!(
                "{label}: no answer in {} s (a hang)\n{out}\n{err}",
                CHILD_LIMIT.as_secs()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

/// Runs `cmd` (a child of this test binary) under `CHILD_LIMIT`: its exit status (`None`
/// when it had to be killed), stdout, stderr and seconds.
fn wait_for(mut cmd: Command) -> (Option<std::process::ExitStatus>, String, String, f64) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn the child test");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if started.elapsed() > CHILD_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status, out, err, started.elapsed().as_secs_f64())
}

/// The compiled kernels kept on disk (`DFSETS_KERNEL_CACHE`): a first process compiles every
/// module it uses and stores it, a second loads them all and compiles none, a damaged entry is
/// compiled again, and `off` keeps nothing. Every process checks its GPU answers against the
/// CPU's (the child `cache_child`), so a cached kernel is shown to compute what a compiled
/// one does. Needs a GPU; passes trivially without one.
#[test]
fn compiled_kernels_are_kept_across_processes() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CACHE_CHILD).is_some() {
        return;
    }
    if let Err(e) = gpu::device() {
        println!("gpu_faults: no GPU ({e}); the kernel cache is not exercised");
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exe = std::env::current_exe().expect("test binary path");
    // `home`: HOME and XDG_CACHE_HOME for the child (where the default cache would go).
    let child = |cache: &std::ffi::OsStr, home: Option<&std::path::Path>| -> (u64, u64) {
        let mut cmd = Command::new(&exe);
        if let Some(h) = home {
            cmd.env("HOME", h).env("XDG_CACHE_HOME", h.join("cache"));
        }
        cmd.args(["--exact", "cache_child", "--ignored", "--nocapture"])
            .env(CACHE_CHILD, "1")
            .env("DFSETS_KERNEL_CACHE", cache)
            .env_remove("DFSETS_GPU_FAULT")
            .env_remove("DFSETS_DISABLE_GPU");
        let (status, out, err, secs) = wait_for(cmd);
        assert!(
            status.is_some_and(|s| s.success()) && out.contains("cache_child: done"),
            "cache child: {status:?}\n{out}\n{err}"
        );
        let counts = out
            .lines()
            .find_map(|l| l.strip_prefix("cache_child: modules compiled, from cache: "))
            .expect("the child's counts");
        let (c, f) = counts.split_once(' ').expect("two counts");
        let counts = (c.parse().unwrap(), f.parse().unwrap());
        println!(
            "gpu_faults: kernel cache child in {secs:.1} s: (compiled, from cache) {counts:?}"
        );
        counts
    };
    let entries = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let (compiled, from_cache) = child(dir.path().as_os_str(), None);
    assert!(
        compiled >= 2,
        "the workloads compile their modules: {compiled}"
    );
    assert_eq!(from_cache, 0, "an empty cache holds nothing");
    let files = entries();
    assert_eq!(
        files.len() as u64,
        compiled,
        "one entry per module: {files:?}"
    );
    assert!(
        files
            .iter()
            .all(|f| f.extension().is_some_and(|e| e == "cubin"))
    );
    assert_eq!(
        child(dir.path().as_os_str(), None),
        (0, compiled),
        "all from the cache"
    );
    // A damaged entry (one byte of its image flipped) is compiled again and replaced.
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        *bytes.last_mut().unwrap() ^= 0x5a;
        std::fs::write(f, bytes).unwrap();
    }
    assert_eq!(
        child(dir.path().as_os_str(), None),
        (compiled, 0),
        "damaged entries"
    );
    assert_eq!(
        child(dir.path().as_os_str(), None),
        (0, compiled),
        "replaced entries"
    );
    // `off`: nothing read, nothing written, not even where the default cache would be.
    let home = tempfile::tempdir().expect("a temporary directory");
    let off = std::ffi::OsStr::new("off");
    assert_eq!(
        child(off, Some(home.path())),
        (compiled, 0),
        "DFSETS_KERNEL_CACHE=off"
    );
    // The CUDA driver keeps caches of its own under HOME (`.nv`); nothing of ours may appear.
    let mut ours = Vec::new();
    let mut todo = vec![home.path().to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.contains("datafusion-sets") || name.ends_with(".cubin") {
                ours.push(path.clone());
            }
            if path.is_dir() {
                todo.push(path);
            }
        }
    }
    assert!(ours.is_empty(), "DFSETS_KERNEL_CACHE=off wrote {ours:?}");
}

/// Runs the three workloads on the GPU and on the CPU, checks the answers equal and the GPU
/// used, and prints the kernel modules compiled and loaded from the cache; does nothing
/// unless started by the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a child process of compiled_kernels_are_kept_across_processes"]
async fn cache_child() {
    if std::env::var_os(CACHE_CHILD).is_none() {
        return;
    }
    // First, before any join kernel is loaded: `auto` (told to use the GPU for any join)
    // takes the GPU at once when the kernel cache holds the join's kernels, and runs the join
    // on the CPU while they compile when it does not.
    datafusion_sets::tuning::set_sj_auto_gpu_from(Some(0));
    let (sql, setup) = workload_sql("simjoin");
    let cpu = run(&setup, sql, "cpu").await;
    let before = counters();
    assert_eq!(
        run(&setup, sql, "auto").await,
        cpu,
        "auto differs from the CPU"
    );
    let on_gpu = counters()[2] > before[2];
    datafusion_sets::tuning::set_sj_auto_gpu_from(None);
    println!("cache_child: first auto join on the GPU: {on_gpu}");
    for workload in WORKLOADS {
        let before = counters();
        let (sql, setup) = workload_sql(workload);
        let cpu = run(&setup, sql, "cpu").await;
        let got = run(&setup, sql, "gpu").await;
        assert_eq!(got, cpu, "{workload}: the GPU differs from the CPU");
        let after = counters();
        assert!(
            after.iter().zip(&before).any(|(a, b)| a > b),
            "{workload} ran on the GPU: {before:?} -> {after:?}"
        );
    }
    let (compiled, from_cache) = gpu::kernel_modules();
    println!("cache_child: modules compiled, from cache: {compiled} {from_cache}");
    println!("cache_child: done");
}

/// One (fault, workload) pair; does nothing unless started by the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a child process of every_fault_ends_on_the_cpu_with_the_same_answer"]
async fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let workload = std::env::var(WORKLOAD).expect("workload");
    let has_gpu = std::env::var(HAS_GPU).is_ok_and(|v| v == "1");
    let armed: Vec<Fault> = Fault::ALL
        .into_iter()
        .filter(|f| gpu::fault::armed(*f))
        .collect();
    let late = std::env::var(LATE).ok().and_then(|n| Fault::parse(&n));
    if let Some(f) = late {
        // The backend starts clean; the fault hits what compiles or runs afterwards.
        let d = gpu::device();
        assert_eq!(d.is_ok(), has_gpu, "{d:?}");
        gpu::fault::arm(f);
    }
    let fault = armed.first().copied().or(late);
    println!("child: {workload}, fault {fault:?} (late: {late:?}), GPU present: {has_gpu}");

    let before = counters();
    let (sql, setup) = workload_sql(&workload);
    let cpu = run(&setup, sql, "cpu").await;
    assert!(cpu.lines().count() > 10, "the workload returns rows: {cpu}");
    for backend in ["gpu", "auto"] {
        let got = run(&setup, sql, backend).await;
        assert_eq!(got, cpu, "sets.backend = '{backend}' differs from the CPU");
    }
    let after = counters();

    // What the backend made of the fault (only observable with a GPU).
    let state = gpu::device();
    println!("child: backend after the workload: {state:?}");
    match (has_gpu, fault) {
        (false, _) => {
            assert!(state.is_err());
            assert_eq!(after, before, "nothing can have run on a GPU");
        }
        (true, None) => panic!("no fault armed"),
        (true, Some(f @ (Fault::NoDriver | Fault::NoNvrtc | Fault::NoDevice))) => {
            let want = match f {
                Fault::NoDriver => GpuError::NoDriver,
                Fault::NoNvrtc => GpuError::NoNvrtc,
                _ => GpuError::NoDevice,
            };
            assert_eq!(state, Err(want.clone()));
            assert_eq!(after, before);
            explain_shows_cpu(&want).await;
        }
        (true, Some(Fault::Compile)) if late.is_none() => {
            match &state {
                Err(e @ GpuError::Compile(log)) => {
                    assert!(log.contains("injected fault"), "NVRTC's log: {log}");
                    explain_shows_cpu(e).await;
                }
                other => panic!("expected a compile error, got {other:?}"),
            }
            assert_eq!(after, before);
        }
        (true, Some(Fault::Compile)) => {
            // The backend is up; the workload's own kernels did not compile.
            assert!(state.is_ok(), "{state:?}");
            assert_eq!(after, before, "no batch ran on the GPU");
        }
        (true, Some(f @ (Fault::OutOfMemory | Fault::PinnedOutOfMemory))) => {
            assert!(
                state.is_ok(),
                "memory faults leave the backend usable: {state:?}"
            );
            if f == Fault::OutOfMemory || workload != "simjoin" {
                assert_eq!(after, before, "no batch completed on the GPU");
            }
            // Once memory is back the GPU runs the workload again, with the same answer.
            gpu::fault::disarm(f);
            let got = run(&setup, sql, "gpu").await;
            assert_eq!(got, cpu, "after the memory fault");
            let again = counters();
            assert!(
                again.iter().zip(&after).any(|(a, b)| a > b),
                "the GPU ran again: {after:?} -> {again:?}"
            );
        }
        (true, Some(Fault::Kernel)) => {
            assert!(
                matches!(state, Err(GpuError::Broken(_))),
                "a kernel fault turns the backend off: {state:?}"
            );
            gpu::fault::disarm(Fault::Kernel);
            let got = run(&setup, sql, "gpu").await;
            assert_eq!(got, cpu, "after the kernel fault");
            if let Err(e) = &state {
                explain_shows_cpu(e).await;
            }
        }
        (true, Some(other)) => panic!("fault {other:?} has no expectation here"),
    }
    println!("child: done");
}

/// Batches run on the GPU so far: list batches, BM25 batches, join chunks.
fn counters() -> [u64; 3] {
    [
        gpu::batches_run(),
        datafusion_sets::search::gpu::bm25_batches_run(),
        datafusion_sets::join::gpu::simjoin_chunks_run(),
    ]
}

/// The workload's query and the statements that create its tables.
fn workload_sql(workload: &str) -> (&'static str, Vec<&'static str>) {
    match workload {
        // Sorted rows, an unsorted one with duplicates, NULL rows, a NULL element, INT and
        // BIGINT, two and three lists, values and counts.
        "intersect" => (
            "SELECT id, list_intersect(a, b), list_intersect_count(a, b), list_intersect(a, b, c) \
             FROM t ORDER BY id",
            vec![
                "CREATE TABLE t AS SELECT v AS id, \
                   CASE WHEN v % 50 = 0 THEN NULL \
                        WHEN v % 97 = 0 THEN CAST([9, 3, 6, 3, 0] AS INT[]) \
                        WHEN v % 89 = 0 THEN CAST([1, NULL, 3] AS INT[]) \
                        ELSE CAST(range(v % 5, 400 + v % 13, 2) AS INT[]) END AS a, \
                   CAST(range(v % 3, 500, 3) AS INT[]) AS b, \
                   range(0, 300 + v, 5) AS c \
                 FROM generate_series(1, 2000) AS s(v)",
            ],
        ),
        // AND, OR and AND-then-OR over an index of 3,000 short documents.
        "bm25" => (
            "SELECT qid, topk_bm25('idx', text, 10, 'or'), topk_bm25('idx', text, 5, 'and'), \
               topk_bm25('idx', text, 7, 'and_or') FROM q ORDER BY qid",
            vec![
                "CREATE TABLE docs AS SELECT v AS doc_id, \
                   concat('w', v % 7, ' x', v % 11, ' y', v % 13, CASE WHEN v % 3 = 0 THEN ' common' ELSE '' END) AS body \
                 FROM generate_series(1, 3000) AS s(v)",
                "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')",
                "CREATE TABLE q AS SELECT v AS qid, \
                   CASE WHEN v % 41 = 0 THEN NULL ELSE concat('w', v % 7, ' x', v % 5, ' common y', v % 17) END AS text \
                 FROM generate_series(1, 400) AS s(v)",
            ],
        ),
        // A self-join of overlapping runs (2,304 pairs), a NULL set and empty ones.
        "simjoin" => (
            "SELECT * FROM similarity_join('sets', 'id', 'tokens', 'jaccard', 0.7) ORDER BY 1, 2",
            vec![
                "CREATE TABLE sets AS SELECT v AS id, \
                   CASE WHEN v = 300 THEN NULL WHEN v % 250 = 0 THEN CAST([] AS INT[]) \
                        ELSE CAST(range(v % 97 * 3, v % 97 * 3 + 10 + v % 7) AS INT[]) END AS tokens \
                 FROM generate_series(1, 600) AS s(v)",
            ],
        ),
        other => panic!("unknown workload {other}"),
    }
}

/// `sql`'s result, pretty-printed, in a new session with `sets.backend = backend`.
async fn run(setup: &[&str], sql: &str, backend: &str) -> String {
    let ctx = new_context();
    exec(&ctx, &format!("SET sets.backend = '{backend}'")).await;
    for s in setup {
        exec(&ctx, s).await;
    }
    let batches = ctx
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("planning {sql} on '{backend}': {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("running {sql} on '{backend}': {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

async fn exec(ctx: &SessionContext, sql: &str) {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// With `sets.backend = 'gpu'`, `EXPLAIN` binds `list_intersect` to the CPU and says why.
async fn explain_shows_cpu(why: &GpuError) {
    let ctx = new_context();
    exec(&ctx, "SET sets.backend = 'gpu'").await;
    exec(
        &ctx,
        "CREATE TABLE e (a INT[], b INT[]) AS VALUES ([1, 2, 3], [2, 3, 4])",
    )
    .await;
    let plan = ctx
        .sql("EXPLAIN SELECT list_intersect(a, b) FROM e")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let plan = pretty_format_batches(&plan).unwrap().to_string();
    let want = format!("list_intersect=cpu (no GPU: {why})");
    let first_line = want.lines().next().unwrap_or_default();
    assert!(plan.contains(first_line), "want {want:?} in {plan}");
}
