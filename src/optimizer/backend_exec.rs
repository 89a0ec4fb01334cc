//! `SetsBackendExec`: a pass-through node above an operator whose set functions the backend
//! rule bound to a device. `EXPLAIN` shows each function's backend and why; `EXPLAIN
//! ANALYZE` shows what the calls did: rows, batches on each device, GPU launches, rows the
//! CPU redid, CPU time, kernel time, whole GPU call time and bytes moved each way.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{Count, Metric, MetricValue, MetricsSet, Time};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use crate::placement::plan::{BackendMetrics, BackendPlan};

/// One bound call: the function's name and its plan.
#[derive(Debug, Clone)]
pub struct BoundCall {
    pub function: String,
    pub plan: Arc<BackendPlan>,
}

/// See the module docs.
#[derive(Debug)]
pub struct SetsBackendExec {
    input: Arc<dyn ExecutionPlan>,
    calls: Vec<BoundCall>,
}

impl SetsBackendExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, calls: Vec<BoundCall>) -> Self {
        Self { input, calls }
    }

    // Used by the codec (`proto` feature).
    #[cfg_attr(not(feature = "proto"), allow(dead_code))]
    /// The calls bound under this node.
    pub fn calls(&self) -> &[BoundCall] {
        &self.calls
    }
}

impl DisplayAs for SetsBackendExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // The tree view titles the box with the node's name already.
        if !matches!(t, DisplayFormatType::TreeRender) {
            write!(f, "SetsBackendExec: ")?;
        }
        for (i, c) in self.calls.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{}={} ({})", c.function, c.plan.backend, c.plan.reason)?;
        }
        Ok(())
    }
}

impl ExecutionPlan for SetsBackendExec {
    fn name(&self) -> &str {
        "SetsBackendExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&children[0]),
            self.calls.clone(),
        )))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        // GPU calls reserve the host memory they stage through in this query's pool.
        for c in &self.calls {
            c.plan
                .bind_pool(context.memory_pool(), &format!("{}[gpu]", c.function));
        }
        self.input.execute(partition, context)
    }
    fn metrics(&self) -> Option<MetricsSet> {
        let mut set = MetricsSet::new();
        let count = |set: &mut MetricsSet, name: String, v: u64| {
            let c = Count::new();
            c.add(v as usize);
            set.push(Arc::new(Metric::new(
                MetricValue::Count {
                    name: name.into(),
                    count: c,
                },
                None,
            )));
        };
        let time = |set: &mut MetricsSet, name: String, ns: u64| {
            let t = Time::new();
            t.add_duration(Duration::from_nanos(ns));
            set.push(Arc::new(Metric::new(
                MetricValue::Time {
                    name: name.into(),
                    time: t,
                },
                None,
            )));
        };
        let many = self.calls.len() > 1;
        for (i, c) in self.calls.iter().enumerate() {
            let m = &c.plan.metrics;
            let g = BackendMetrics::get;
            let p = |s: &str| {
                if many {
                    format!("{s}_{i}")
                } else {
                    s.to_string()
                }
            };
            count(&mut set, p("rows"), g(&m.rows));
            count(&mut set, p("cpu_batches"), g(&m.cpu_batches));
            count(&mut set, p("gpu_batches"), g(&m.gpu_batches));
            count(&mut set, p("gpu_launches"), g(&m.gpu_launches));
            count(&mut set, p("gpu_rows_redone"), g(&m.gpu_rows_redone));
            count(&mut set, p("bytes_to_device"), g(&m.h2d_bytes));
            count(&mut set, p("bytes_from_device"), g(&m.d2h_bytes));
            count(&mut set, p("gpu_columns_reused"), g(&m.gpu_columns_reused));
            count(
                &mut set,
                p("gpu_columns_uploaded"),
                g(&m.gpu_columns_uploaded),
            );
            time(&mut set, p("cpu_time"), g(&m.cpu_ns));
            time(&mut set, p("kernel_time"), g(&m.kernel_ns));
            time(&mut set, p("gpu_time"), g(&m.gpu_ns));
        }
        Some(set)
    }
}
