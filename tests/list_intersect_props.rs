//! Property tests of the SQL functions on Arrow arrays, against DataFusion's built-in
//! `array_intersect` as the oracle: random integer types, List and LargeList, sorted,
//! unsorted, duplicated, NULL lists and NULL elements, empty rows, sliced arrays (both the
//! list array and its child), every forced kernel, threaded and not.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, GenericListArray, Int8Array, Int64Array, LargeListArray,
    OffsetSizeTrait, UInt64Array, new_empty_array,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF};
use datafusion_sets::SetsConfig;
use datafusion_sets::udf::list_intersect_count_udf;
use datafusion_sets::udf::list_intersect_udf;
use proptest::prelude::*;

const TYPES: [DataType; 8] = [
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::UInt8,
    DataType::UInt16,
    DataType::UInt32,
    DataType::UInt64,
];
const KERNELS: [&str; 7] = [
    "auto",
    "scalar",
    "galloping",
    "sse42",
    "avx2",
    "avx512",
    "vp2intersect",
];

/// One row: `None` = NULL list; elements `None` = NULL element.
type Row = Option<Vec<Option<i64>>>;

fn row_strategy() -> impl Strategy<Value = Row> {
    let values = prop_oneof![
        // sorted unique (posting list), dense or sparse
        (0i64..120, 0usize..90, 1i64..4)
            .prop_map(|(start, n, step)| (0..n as i64).map(|i| Some(start + i * step)).collect()),
        // sorted with duplicates
        prop::collection::vec(0i64..60, 0..70).prop_map(|mut v| {
            v.sort();
            v.into_iter().map(Some).collect()
        }),
        // unsorted, with duplicates
        prop::collection::vec(0i64..50, 0..40).prop_map(|v| v.into_iter().map(Some).collect()),
        // with NULL elements
        prop::collection::vec(prop::option::weighted(0.8, 0i64..30), 0..20),
        // long sorted, for skewed pairs
        (0i64..5, 200usize..2000)
            .prop_map(|(start, n)| (0..n as i64).map(|i| Some(start + 2 * i)).collect()),
        // long and sorted but for one neighbour pair, swapped or repeated (nearly sorted:
        // the order-checking kernel must refuse it wherever the pair is)
        (
            0i64..5,
            200usize..2000,
            any::<prop::sample::Index>(),
            any::<bool>()
        )
            .prop_map(|(start, n, at, repeat)| {
                let mut v: Vec<i64> = (0..n as i64).map(|i| start + 2 * i).collect();
                let p = at.index(n - 1);
                if repeat {
                    v[p + 1] = v[p];
                } else {
                    v.swap(p, p + 1);
                }
                v.into_iter().map(Some).collect()
            }),
    ];
    prop::option::weighted(0.9, values)
}

fn build<O: OffsetSizeTrait>(rows: &[Row], element: &DataType, pad: usize) -> ArrayRef {
    // `pad` junk values before and after the child's used range, then a sliced child: the
    // list's offsets start at `pad` and its child array itself has an offset.
    let mut values: Vec<Option<i64>> = vec![Some(7); pad];
    let mut offsets = vec![O::usize_as(pad)];
    for r in rows {
        if let Some(r) = r {
            values.extend(r.iter().copied());
        }
        offsets.push(O::usize_as(values.len()));
    }
    values.extend(std::iter::repeat_n(Some(3), pad));
    let child: ArrayRef = Arc::new(Int64Array::from(values));
    let child = cast(&child, element).expect("values fit every type");
    let nulls = NullBuffer::from(rows.iter().map(Option::is_some).collect::<Vec<_>>());
    let field = Arc::new(Field::new_list_field(element.clone(), true));
    Arc::new(GenericListArray::<O>::new(
        field,
        OffsetBuffer::new(offsets.into()),
        child,
        Some(nulls),
    ))
}

fn options(kernel: &str, threaded: bool) -> Arc<ConfigOptions> {
    let mut options = ConfigOptions::new();
    options.extensions.insert(SetsConfig::default());
    // Forcing a kernel is a `tuning` switch; without the feature every case runs `auto`.
    #[cfg(feature = "tuning")]
    {
        options
            .extensions
            .insert(datafusion_sets::TuningOptions::default());
        options
            .set("tuning.cpu_kernel", kernel)
            .expect("kernel name");
    }
    #[cfg(not(feature = "tuning"))]
    let _ = kernel;
    options
        .set("sets.parallel_min_values", if threaded { "1" } else { "0" })
        .expect("number");
    Arc::new(options)
}

fn invoke(
    udf: &ScalarUDF,
    args: &[ArrayRef],
    return_type: DataType,
    config: Arc<ConfigOptions>,
) -> ArrayRef {
    let arg_fields = args
        .iter()
        .map(|a| Arc::new(Field::new("a", a.data_type().clone(), true)))
        .collect();
    let result = udf
        .invoke_with_args(ScalarFunctionArgs {
            args: args
                .iter()
                .map(|a| ColumnarValue::Array(Arc::clone(a)))
                .collect(),
            arg_fields,
            number_rows: args[0].len(),
            return_field: Arc::new(Field::new("r", return_type, true)),
            config_options: config,
        })
        .expect("invoke");
    result.into_array(args[0].len()).expect("array")
}

/// The built-in, folded left over the arguments.
fn oracle(args: &[ArrayRef]) -> ArrayRef {
    let builtin = datafusion::functions_nested::set_ops::array_intersect_udf();
    let mut acc = Arc::clone(&args[0]);
    for a in &args[1..] {
        acc = invoke(
            &builtin,
            &[acc, Arc::clone(a)],
            args[0].data_type().clone(),
            Arc::new(ConfigOptions::new()),
        );
    }
    acc
}

fn counts(list: &ArrayRef) -> UInt64Array {
    let lens: Vec<Option<u64>> = (0..list.len())
        .map(|i| {
            list.is_valid(i).then(|| match list.data_type() {
                DataType::LargeList(_) => list.as_list::<i64>().value_length(i) as u64,
                _ => list.as_list::<i32>().value_length(i) as u64,
            })
        })
        .collect();
    UInt64Array::from(lens)
}

fn check(
    rows: Vec<Vec<Row>>,
    type_idx: usize,
    large: bool,
    pad: usize,
    slice: (usize, usize),
    kernel_idx: usize,
    threaded: bool,
) {
    let element = &TYPES[type_idx];
    let n = rows[0].len();
    let args: Vec<ArrayRef> = rows
        .iter()
        .map(|col| {
            if large {
                build::<i64>(col, element, pad)
            } else {
                build::<i32>(col, element, pad)
            }
        })
        .collect();
    // Slice the list arrays too.
    let start = slice.0.min(n);
    let len = slice.1.min(n - start);
    let args: Vec<ArrayRef> = args.iter().map(|a| a.slice(start, len)).collect();
    let config = options(KERNELS[kernel_idx], threaded);
    let expected = oracle(&args);
    let ours = invoke(
        &list_intersect_udf(),
        &args,
        args[0].data_type().clone(),
        Arc::clone(&config),
    );
    assert_eq!(ours.data_type(), expected.data_type());
    assert_eq!(
        &ours, &expected,
        "kernel {} on {element}",
        KERNELS[kernel_idx]
    );
    let count = invoke(&list_intersect_count_udf(), &args, DataType::UInt64, config);
    assert_eq!(
        count.as_primitive::<datafusion::arrow::datatypes::UInt64Type>(),
        &counts(&expected)
    );
}

fn columns(k: usize) -> impl Strategy<Value = Vec<Vec<Row>>> {
    (1usize..24)
        .prop_flat_map(move |n| prop::collection::vec(prop::collection::vec(row_strategy(), n), k))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn two_lists_match_builtin(
        rows in columns(2), type_idx in 0usize..8, large: bool, pad in 0usize..5,
        slice in (0usize..4, 1usize..30), kernel_idx in 0usize..7, threaded: bool,
    ) {
        check(rows, type_idx, large, pad, slice, kernel_idx, threaded);
    }

    #[test]
    fn k_lists_match_builtin_fold(
        rows in (3usize..6).prop_flat_map(columns), type_idx in 0usize..8, large: bool, pad in 0usize..3,
        slice in (0usize..3, 1usize..30), kernel_idx in 0usize..7, threaded: bool,
    ) {
        check(rows, type_idx, large, pad, slice, kernel_idx, threaded);
    }
}

#[test]
fn empty_batch() {
    let field = Arc::new(Field::new_list_field(DataType::Int32, true));
    let empty: ArrayRef = Arc::new(GenericListArray::<i32>::new(
        field,
        OffsetBuffer::new_empty(),
        new_empty_array(&DataType::Int32),
        None,
    ));
    let ours = invoke(
        &list_intersect_udf(),
        &[Arc::clone(&empty), Arc::clone(&empty)],
        empty.data_type().clone(),
        options("auto", false),
    );
    assert_eq!(ours.len(), 0);
}

/// A LargeList whose values run past 2^31: offsets that only i64 holds must be read right.
/// Row 0 holds 2^31 + 8 copies of 0 (sorted with duplicates); row 1, stored after them,
/// holds 1..=100 (sorted, unique).
#[test]
fn large_list_past_two_to_the_31() {
    let big = (1usize << 31) + 8;
    let mut values = vec![0i8; big];
    values.extend(1..=100i8);
    let offsets = OffsetBuffer::new(vec![0i64, big as i64, big as i64 + 100].into());
    let field = Arc::new(Field::new_list_field(DataType::Int8, true));
    let a: ArrayRef = Arc::new(LargeListArray::new(
        Arc::clone(&field),
        offsets,
        Arc::new(Int8Array::from(values)),
        None,
    ));
    let b: ArrayRef = Arc::new(LargeListArray::new(
        field,
        OffsetBuffer::new(vec![0i64, 2, 5].into()),
        Arc::new(Int8Array::from(vec![0i8, 5, 3, 50, 127])),
        None,
    ));
    let ours = invoke(
        &list_intersect_udf(),
        &[a.clone(), b.clone()],
        a.data_type().clone(),
        options("auto", false),
    );
    let ours = ours.as_list::<i64>();
    assert_eq!(
        ours.value(0)
            .as_primitive::<datafusion::arrow::datatypes::Int8Type>()
            .values()
            .as_ref(),
        &[0i8]
    );
    assert_eq!(
        ours.value(1)
            .as_primitive::<datafusion::arrow::datatypes::Int8Type>()
            .values()
            .as_ref(),
        &[3i8, 50]
    );
    let count = invoke(
        &list_intersect_count_udf(),
        &[a, b],
        DataType::UInt64,
        options("auto", true),
    );
    assert_eq!(
        count
            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
            .values()
            .as_ref(),
        &[1u64, 2]
    );
}
