//! [`SetsCodec`]: the `datafusion-proto` codec of every node and stateful function of the
//! crate, so a plan that uses them can be sent to another process (a datafusion-distributed
//! worker, a Ballista executor) and run there with the same answer.
//!
//! What travels is what the plan means, not what the sending process chose for its own
//! hardware: a bound call (`SetsBackendExec`) is decoded unbound and bound again by the
//! receiving session's backend rule, under its `sets.*` options and for its own GPU or CPU.
//! A `topk_bm25` table scan carries the index table's scan plan, so the receiver needs no
//! catalog entry for it; the `topk_bm25` scalar function (decoded by name, made the
//! receiving session's async function again) reads the index table by name from the
//! receiving session's catalog, as it does at home.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::{Result, internal_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::async_udf::AsyncScalarUDF;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::async_func::AsyncFuncExec;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_proto_converter, physical_plan_to_bytes_with_proto_converter,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use prost::Message;

use crate::config::BackendChoice;
use crate::functions::topk_bm25::table::{TOPK_BM25, TopkOneExec};
use crate::functions::topk_bm25::{SessionHandle, TopkBm25, async_call};
use crate::intersect::similarity::Measure;
use crate::io::time_slice::TimeSliceExec;
use crate::join::exec::OutputKind;
use crate::join::route::PrefixRouteExec;
use crate::join::{
    Comparison, JoinColumn, JoinDistribution, JoinInput, SimilarityJoinExec, Threshold,
};
use crate::optimizer::backend_exec::SetsBackendExec;
use crate::optimizer::backend_rule::SetsBackendRule;
use crate::search::build::{Bm25IndexExec, Bm25MergeExec, Bm25PartsExec};
use crate::search::loaded::IndexScan;
use crate::search::shard_queries::{TopkQueriesMergeExec, TopkQueriesShardsExec};
use crate::search::shards::{TopkMergeExec, TopkShardsExec};
use crate::search::tokenize::TokenizerOptions;
use crate::search::topk::Mode;

/// The codec of the crate's nodes and of the async `topk_bm25` function, for a session the
/// crate is installed in (the handle of its catalog and runtime: a decoded `topk_bm25` reads
/// index tables through them). Register it with the session's other codecs (in
/// datafusion-distributed, `crate::distributed::SetsDistributedExt` does it).
#[derive(Debug, Clone)]
pub struct SetsCodec {
    session: SessionHandle,
}

impl SetsCodec {
    /// The codec of the session whose handle is `session`.
    pub fn new(session: SessionHandle) -> Self {
        Self { session }
    }
}

/// Every node the codec writes: one message with the node's kind and its fields.
#[derive(Clone, PartialEq, Message)]
struct SetsNode {
    #[prost(oneof = "Node", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10")]
    node: Option<Node>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Node {
    #[prost(message, tag = "1")]
    Backend(BackendNode),
    #[prost(message, tag = "2")]
    TimeSlice(TimeSliceNode),
    #[prost(message, tag = "3")]
    Join(JoinNode),
    #[prost(message, tag = "4")]
    Bm25Index(Bm25IndexNode),
    #[prost(message, tag = "5")]
    TopkOne(TopkOneNode),
    #[prost(message, tag = "6")]
    Route(RouteNode),
    #[prost(message, tag = "7")]
    TopkShards(TopkShardsNode),
    #[prost(message, tag = "8")]
    TopkMerge(TopkMergeNode),
    #[prost(message, tag = "9")]
    TopkQueriesShards(TopkQueriesShardsNode),
    #[prost(message, tag = "10")]
    TopkQueriesMerge(TopkQueriesMergeNode),
}

/// `TopkQueriesShardsExec`; its inputs are the index table's scan and the queries.
#[derive(Clone, PartialEq, Message)]
struct TopkQueriesShardsNode {
    #[prost(string, tag = "1")]
    index_name: String,
    #[prost(uint64, tag = "2")]
    k: u64,
    #[prost(string, tag = "3")]
    mode: String,
}

/// `TopkQueriesMergeExec`; its input is the partitions' lists.
#[derive(Clone, PartialEq, Message)]
struct TopkQueriesMergeNode {
    #[prost(uint64, tag = "1")]
    k: u64,
    #[prost(string, tag = "2")]
    mode: String,
}

/// `TopkShardsExec`; its input is the sharded index table's scan.
#[derive(Clone, PartialEq, Message)]
struct TopkShardsNode {
    #[prost(string, tag = "1")]
    index_name: String,
    #[prost(string, tag = "2")]
    query: String,
    #[prost(uint64, tag = "3")]
    k: u64,
    #[prost(string, tag = "4")]
    mode: String,
}

/// `TopkMergeExec`; its input is the shards' hits.
#[derive(Clone, PartialEq, Message)]
struct TopkMergeNode {
    #[prost(uint64, tag = "1")]
    k: u64,
    #[prost(string, tag = "2")]
    mode: String,
    #[prost(bool, tag = "3")]
    projected: bool,
    #[prost(uint64, repeated, tag = "4")]
    projection: Vec<u64>,
}

/// `PrefixRouteExec`; its inputs are the sets and the token counts.
#[derive(Clone, PartialEq, Message)]
struct RouteNode {
    #[prost(uint64, repeated, tag = "1")]
    keep: Vec<u64>,
    #[prost(uint64, tag = "2")]
    tokens: u64,
    #[prost(string, tag = "3")]
    measure: String,
    #[prost(double, tag = "4")]
    threshold: f64,
    #[prost(string, tag = "5")]
    comparison: String,
    #[prost(uint32, tag = "6")]
    buckets: u32,
}

/// `SetsBackendExec`: the names of the calls bound under it (for errors); the binding itself
/// is made again where the plan is decoded.
#[derive(Clone, PartialEq, Message)]
struct BackendNode {
    #[prost(string, repeated, tag = "1")]
    functions: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct TimeSliceNode {}

#[derive(Clone, PartialEq, Message)]
struct JoinInputNode {
    #[prost(uint64, optional, tag = "1")]
    id: Option<u64>,
    #[prost(uint64, tag = "2")]
    tokens: u64,
}

/// One output column: `kind` 0 left, 1 right, 2 similarity; `index` the input column.
#[derive(Clone, PartialEq, Message)]
struct JoinColumnNode {
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(uint64, tag = "2")]
    index: u64,
}

#[derive(Clone, PartialEq, Message)]
struct JoinNode {
    #[prost(message, optional, tag = "1")]
    left: Option<JoinInputNode>,
    /// Absent for a self-join.
    #[prost(message, optional, tag = "2")]
    right: Option<JoinInputNode>,
    #[prost(string, tag = "3")]
    measure: String,
    #[prost(double, tag = "4")]
    threshold: f64,
    #[prost(string, tag = "5")]
    comparison: String,
    /// `true`: `(left_id, right_id, similarity)` projected by `projection`; `false`: the
    /// columns `columns` named by `schema`.
    #[prost(bool, tag = "6")]
    ids: bool,
    #[prost(bool, tag = "7")]
    projected: bool,
    #[prost(uint64, repeated, tag = "8")]
    projection: Vec<u64>,
    #[prost(message, repeated, tag = "9")]
    columns: Vec<JoinColumnNode>,
    #[prost(message, optional, tag = "10")]
    schema: Option<datafusion_proto::protobuf::Schema>,
    #[prost(uint64, tag = "11")]
    partitions: u64,
    #[prost(string, tag = "12")]
    backend: String,
    /// `single` (or empty), `prefix`, `broadcast` or `replicated`.
    #[prost(string, tag = "13")]
    distribution: String,
    /// The routers' bucket count of a prefix-partitioned join.
    #[prost(uint32, tag = "14")]
    buckets: u32,
}

#[derive(Clone, PartialEq, Message)]
struct Bm25IndexNode {
    /// The tokenizer options as an index records them.
    #[prost(string, tag = "1")]
    tokenizer: String,
    #[prost(bool, tag = "2")]
    with_static: bool,
    /// Which operator: "" (`Bm25IndexExec`), "parts" or "merge".
    #[prost(string, tag = "3")]
    stage: String,
    /// The parts' bucket count.
    #[prost(uint32, tag = "4")]
    buckets: u32,
    /// `Bm25IndexExec`'s shards (0: unsharded).
    #[prost(uint32, tag = "5")]
    shards: u32,
}

#[derive(Clone, PartialEq, Message)]
struct TopkOneNode {
    #[prost(string, tag = "1")]
    index_name: String,
    /// The index table's scan plan, encoded with this codec.
    #[prost(bytes = "vec", tag = "2")]
    index_scan: Vec<u8>,
    #[prost(string, tag = "3")]
    query: String,
    #[prost(uint64, tag = "4")]
    k: u64,
    #[prost(string, tag = "5")]
    mode: String,
    #[prost(bool, tag = "6")]
    projected: bool,
    #[prost(uint64, repeated, tag = "7")]
    projection: Vec<u64>,
}

fn usizes(v: &[u64]) -> Vec<usize> {
    v.iter().map(|&i| i as usize).collect()
}

fn u64s(v: &[usize]) -> Vec<u64> {
    v.iter().map(|&i| i as u64).collect()
}

fn input_node(i: &JoinInput) -> JoinInputNode {
    JoinInputNode {
        id: i.id.map(|v| v as u64),
        tokens: i.tokens as u64,
    }
}

fn measure_of(name: &str) -> Result<Measure> {
    match Measure::ALL.iter().find(|m| m.name() == name) {
        Some(m) => Ok(*m),
        None => plan_err!("SetsCodec: unknown similarity measure '{name}'"),
    }
}

/// A `topk_bm25` mode by name.
fn mode_of(name: &str) -> Result<Mode> {
    match Mode::from_name(name) {
        Some(m) => Ok(m),
        None => plan_err!("SetsCodec: {TOPK_BM25}: unknown mode '{name}'"),
    }
}

/// The threshold written as `(measure, value, comparison)`.
fn threshold_of(measure: &str, value: f64, comparison: &str, node: &str) -> Result<Threshold> {
    let Some(cmp) = Comparison::from_op(comparison) else {
        return plan_err!("SetsCodec: unknown comparison '{comparison}'");
    };
    Threshold::try_new(
        measure_of(measure)?,
        value,
        cmp,
        &format!("SetsCodec: {node}"),
    )
}

/// `inputs[i]`, or an error naming the node.
fn input(
    inputs: &[Arc<dyn ExecutionPlan>],
    i: usize,
    node: &str,
) -> Result<Arc<dyn ExecutionPlan>> {
    match inputs.get(i) {
        Some(p) => Ok(Arc::clone(p)),
        None => internal_err!("SetsCodec: {node} decoded with {} inputs", inputs.len()),
    }
}

impl SetsCodec {
    fn encode_node(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Node> {
        if let Some(b) = node.downcast_ref::<SetsBackendExec>() {
            return Ok(Node::Backend(BackendNode {
                functions: b.calls().iter().map(|c| c.function.clone()).collect(),
            }));
        }
        if node.is::<TimeSliceExec>() {
            return Ok(Node::TimeSlice(TimeSliceNode {}));
        }
        if let Some(j) = node.downcast_ref::<SimilarityJoinExec>() {
            let (ids, projection) = match &j.kind {
                OutputKind::Ids { projection } => (true, projection.clone()),
                OutputKind::Rows => (false, None),
            };
            let columns = j
                .columns
                .iter()
                .map(|c| match c {
                    JoinColumn::Left(i) => JoinColumnNode {
                        kind: 0,
                        index: *i as u64,
                    },
                    JoinColumn::Right(i) => JoinColumnNode {
                        kind: 1,
                        index: *i as u64,
                    },
                    JoinColumn::Similarity => JoinColumnNode { kind: 2, index: 0 },
                })
                .collect();
            return Ok(Node::Join(JoinNode {
                left: Some(input_node(&j.left)),
                right: j.right.as_ref().map(input_node),
                measure: j.threshold.measure().name().to_string(),
                threshold: j.threshold.value(),
                comparison: j.threshold.comparison().to_string(),
                ids,
                projected: projection.is_some(),
                projection: u64s(projection.as_deref().unwrap_or_default()),
                columns,
                schema: Some(j.schema.as_ref().try_into()?),
                partitions: j.partitions as u64,
                backend: j.backend.to_string(),
                distribution: match j.distribution {
                    JoinDistribution::Single => "single",
                    JoinDistribution::Prefix { .. } => "prefix",
                    JoinDistribution::Broadcast => "broadcast",
                    JoinDistribution::Replicated => "replicated",
                }
                .to_string(),
                buckets: match j.distribution {
                    JoinDistribution::Prefix { buckets } => buckets,
                    _ => 0,
                },
            }));
        }
        if let Some(r) = node.downcast_ref::<PrefixRouteExec>() {
            return Ok(Node::Route(RouteNode {
                keep: u64s(&r.keep),
                tokens: r.tokens as u64,
                measure: r.threshold.measure().name().to_string(),
                threshold: r.threshold.value(),
                comparison: r.threshold.comparison().to_string(),
                buckets: r.buckets,
            }));
        }
        let index = |stage: &str, tokenizer: TokenizerOptions, with_static, buckets, shards| {
            Ok(Node::Bm25Index(Bm25IndexNode {
                tokenizer: tokenizer.to_string(),
                with_static,
                stage: stage.to_string(),
                buckets,
                shards,
            }))
        };
        if let Some(b) = node.downcast_ref::<Bm25IndexExec>() {
            return index("", b.tokenizer, b.with_static, 0, b.shards);
        }
        if let Some(b) = node.downcast_ref::<Bm25PartsExec>() {
            return index("parts", b.tokenizer, b.with_static, b.buckets, 0);
        }
        if let Some(b) = node.downcast_ref::<Bm25MergeExec>() {
            return index("merge", b.tokenizer, b.with_static, 0, 0);
        }
        if let Some(t) = node.downcast_ref::<TopkOneExec>() {
            let scan = physical_plan_to_bytes_with_proto_converter(
                Arc::clone(t.index.scan()),
                self,
                converter,
            )?;
            return Ok(Node::TopkOne(TopkOneNode {
                index_name: t.index.name().to_string(),
                index_scan: scan.to_vec(),
                query: t.query.clone(),
                k: t.k as u64,
                mode: t.mode.name().to_string(),
                projected: t.projection.is_some(),
                projection: u64s(t.projection.as_deref().unwrap_or_default()),
            }));
        }
        if let Some(t) = node.downcast_ref::<TopkShardsExec>() {
            return Ok(Node::TopkShards(TopkShardsNode {
                index_name: t.index.clone(),
                query: t.query.clone(),
                k: t.k as u64,
                mode: t.mode.name().to_string(),
            }));
        }
        if let Some(t) = node.downcast_ref::<TopkMergeExec>() {
            return Ok(Node::TopkMerge(TopkMergeNode {
                k: t.k as u64,
                mode: t.mode.name().to_string(),
                projected: t.projection.is_some(),
                projection: u64s(t.projection.as_deref().unwrap_or_default()),
            }));
        }
        if let Some(t) = node.downcast_ref::<TopkQueriesShardsExec>() {
            return Ok(Node::TopkQueriesShards(TopkQueriesShardsNode {
                index_name: t.index.clone(),
                k: t.k as u64,
                mode: t.mode.name().to_string(),
            }));
        }
        if let Some(t) = node.downcast_ref::<TopkQueriesMergeExec>() {
            return Ok(Node::TopkQueriesMerge(TopkQueriesMergeNode {
                k: t.k as u64,
                mode: t.mode.name().to_string(),
            }));
        }
        internal_err!("SetsCodec cannot encode {}", node.name())
    }

    fn decode_node(
        &self,
        node: Node,
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match node {
            Node::Backend(b) => {
                let child = with_async_topk(&input(inputs, 0, "SetsBackendExec")?, &self.session)?;
                // Bound again here: this session's options, this machine's devices.
                let rule = SetsBackendRule::new(self.session.clone());
                let bound = rule.optimize(Arc::clone(&child), ctx.session_config().options())?;
                if Arc::ptr_eq(&bound, &child) || !bound.is::<SetsBackendExec>() {
                    return plan_err!(
                        "SetsCodec: the calls of {} arrived unbindable: is datafusion-sets installed in this session (with_sets), with its functions under their own names?",
                        b.functions.join(", ")
                    );
                }
                Ok(bound)
            }
            Node::TimeSlice(_) => Ok(Arc::new(TimeSliceExec::new(input(
                inputs,
                0,
                "TimeSliceExec",
            )?))),
            Node::Join(j) => decode_join(j, inputs),
            Node::Route(r) => Ok(Arc::new(PrefixRouteExec::try_new(
                input(inputs, 0, "PrefixRouteExec")?,
                input(inputs, 1, "PrefixRouteExec")?,
                usizes(&r.keep),
                r.tokens as usize,
                threshold_of(&r.measure, r.threshold, &r.comparison, "PrefixRouteExec")?,
                r.buckets,
            )?)),
            Node::Bm25Index(b) => {
                let tokenizer = TokenizerOptions::parse(&b.tokenizer, "SetsCodec: bm25_index")?;
                let child = |name| input(inputs, 0, name);
                Ok(match b.stage.as_str() {
                    "" => Arc::new(Bm25IndexExec::new(
                        child("Bm25IndexExec")?,
                        tokenizer,
                        b.with_static,
                        b.shards,
                    )),
                    "parts" => Arc::new(Bm25PartsExec::try_new(
                        child("Bm25PartsExec")?,
                        tokenizer,
                        b.with_static,
                        b.buckets,
                    )?),
                    "merge" => Arc::new(Bm25MergeExec::try_new(
                        child("Bm25MergeExec")?,
                        tokenizer,
                        b.with_static,
                    )?),
                    other => return plan_err!("SetsCodec: bm25_index: unknown stage '{other}'"),
                })
            }
            Node::TopkOne(t) => {
                let scan = physical_plan_from_bytes_with_proto_converter(
                    &t.index_scan,
                    ctx,
                    self,
                    converter,
                )?;
                Ok(Arc::new(TopkOneExec::try_new(
                    IndexScan::from_scan(&t.index_name, scan),
                    t.query,
                    t.k as usize,
                    mode_of(&t.mode)?,
                    t.projected.then(|| usizes(&t.projection)),
                )?))
            }
            Node::TopkShards(t) => Ok(Arc::new(TopkShardsExec::try_new(
                input(inputs, 0, "TopkBm25ShardsExec")?,
                t.index_name,
                t.query,
                t.k as usize,
                mode_of(&t.mode)?,
            )?)),
            Node::TopkQueriesShards(t) => Ok(Arc::new(TopkQueriesShardsExec::try_new(
                input(inputs, 0, "TopkBm25QueriesShardsExec")?,
                input(inputs, 1, "TopkBm25QueriesShardsExec")?,
                t.index_name,
                t.k as usize,
                mode_of(&t.mode)?,
            )?)),
            Node::TopkQueriesMerge(t) => Ok(Arc::new(TopkQueriesMergeExec::try_new(
                input(inputs, 0, "TopkBm25QueriesMergeExec")?,
                t.k as usize,
                mode_of(&t.mode)?,
            )?)),
            Node::TopkMerge(t) => Ok(Arc::new(TopkMergeExec::try_new(
                input(inputs, 0, "TopkBm25MergeExec")?,
                t.k as usize,
                mode_of(&t.mode)?,
                t.projected.then(|| usizes(&t.projection)),
            )?)),
        }
    }
}

/// `plan` with every `topk_bm25` call of an `AsyncFuncExec` on top made the async function
/// of `session`. A decoder finds functions by name in its registry, where `topk_bm25` is the
/// entry the analyzer rewrites, not the function a plan runs.
fn with_async_topk(
    plan: &Arc<dyn ExecutionPlan>,
    session: &SessionHandle,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(node) = plan.downcast_ref::<AsyncFuncExec>() else {
        return Ok(Arc::clone(plan));
    };
    let schema = node.input().schema();
    // `async_exprs` is the only way to read the expressions back (deprecated in 55 for lack
    // of another user; still public and the field the node is made of).
    #[allow(deprecated)]
    let async_exprs = node.async_exprs();
    let mut exprs = Vec::with_capacity(async_exprs.len());
    let mut changed = false;
    for ae in async_exprs {
        let plain = ae
            .func
            .downcast_ref::<ScalarFunctionExpr>()
            .filter(|sf| sf.name() == TOPK_BM25 && !sf.fun().inner().is::<AsyncScalarUDF>());
        let Some(sf) = plain else {
            exprs.push(Arc::clone(ae));
            continue;
        };
        exprs.push(async_call(
            ae.name(),
            sf,
            TopkBm25::new(session.clone()),
            &schema,
        )?);
        changed = true;
    }
    if !changed {
        return Ok(Arc::clone(plan));
    }
    Ok(Arc::new(AsyncFuncExec::try_new(
        exprs,
        Arc::clone(node.input()),
    )?))
}

fn decode_join(j: JoinNode, inputs: &[Arc<dyn ExecutionPlan>]) -> Result<Arc<dyn ExecutionPlan>> {
    let join_input = |n: &JoinInputNode, plan: Arc<dyn ExecutionPlan>| JoinInput {
        plan,
        id: n.id.map(|v| v as usize),
        tokens: n.tokens as usize,
    };
    let Some(left) = &j.left else {
        return plan_err!("SetsCodec: SimilarityJoinExec without its left input");
    };
    let left = join_input(left, input(inputs, 0, "SimilarityJoinExec")?);
    let right = match &j.right {
        Some(r) => Some(join_input(r, input(inputs, 1, "SimilarityJoinExec")?)),
        None => None,
    };
    let threshold = threshold_of(&j.measure, j.threshold, &j.comparison, "SimilarityJoinExec")?;
    let distribution = match j.distribution.as_str() {
        "" | "single" => JoinDistribution::Single,
        "prefix" => JoinDistribution::Prefix { buckets: j.buckets },
        "broadcast" => JoinDistribution::Broadcast,
        "replicated" => JoinDistribution::Replicated,
        other => return plan_err!("SetsCodec: unknown join distribution '{other}'"),
    };
    let backend: BackendChoice = j.backend.parse()?;
    let partitions = j.partitions as usize;
    let exec = if j.ids {
        SimilarityJoinExec::try_new(
            left,
            right,
            threshold,
            j.projected.then(|| usizes(&j.projection)),
            partitions,
        )?
    } else {
        let Some(schema) = &j.schema else {
            return plan_err!("SetsCodec: SimilarityJoinExec without its schema");
        };
        let schema: Schema = schema.try_into()?;
        let mut columns = Vec::with_capacity(j.columns.len());
        for c in &j.columns {
            columns.push(match c.kind {
                0 => JoinColumn::Left(c.index as usize),
                1 => JoinColumn::Right(c.index as usize),
                2 => JoinColumn::Similarity,
                k => return plan_err!("SetsCodec: unknown join column kind {k}"),
            });
        }
        SimilarityJoinExec::try_with_columns(
            left,
            right,
            threshold,
            columns,
            Arc::new(schema),
            partitions,
        )?
    };
    Ok(Arc::new(
        exec.with_backend(backend).with_distribution(distribution)?,
    ))
}

impl PhysicalExtensionCodec for SetsCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let msg = SetsNode::decode(buf).map_err(|e| {
            datafusion::common::DataFusionError::Plan(format!(
                "SetsCodec: not a datafusion-sets node ({e})"
            ))
        })?;
        match msg.node {
            Some(node) => self.decode_node(node, inputs, ctx, converter),
            None => plan_err!("SetsCodec: an empty datafusion-sets node"),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let msg = SetsNode {
            node: Some(self.encode_node(&node, converter)?),
        };
        msg.encode(buf)
            .map_err(|e| datafusion::common::DataFusionError::Internal(format!("SetsCodec: {e}")))
    }
}
