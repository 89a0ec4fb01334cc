//! Integer list columns seen through their Arrow buffers ([`IntLists`]), the element-type
//! helpers and list-argument coercion (DataFusion's rules for `array_intersect`), and the
//! integer type dispatcher every engine uses.

use datafusion::arrow::array::{
    Array, ArrowPrimitiveType, AsArray, GenericListArray, OffsetSizeTrait,
};
use datafusion::arrow::buffer::{Buffer, NullBuffer};
use datafusion::arrow::datatypes::ArrowNativeType;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::type_coercion::binary::type_union_resolution;

use crate::backend::cpu::SetElem;

/// Element type of a list type (`None` for anything else).
pub fn list_element_type(dt: &DataType) -> Option<&DataType> {
    match dt {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

/// Coerce the arguments of an n-ary list set function exactly as DataFusion's
/// `Signature::arrays(n, Some(ListCoercion::FixedSizedListToList))` does for the built-in
/// `array_intersect`: element types unified with `type_union_resolution`, any `LargeList`
/// makes every list a `LargeList`, `FixedSizeList` becomes `List`, `NULL` stays `NULL`.
/// Errors name the function and the offending argument (1-based).
pub fn coerce_list_args(
    name: &str,
    arg_types: &[DataType],
    min_args: usize,
) -> Result<Vec<DataType>> {
    if arg_types.len() < min_args {
        return plan_err!(
            "{name} expects at least {min_args} list arguments, got {}",
            arg_types.len()
        );
    }
    let mut large = false;
    let mut elements = Vec::with_capacity(arg_types.len());
    for (i, dt) in arg_types.iter().enumerate() {
        match dt {
            DataType::Null => elements.push(DataType::Null),
            DataType::List(f) | DataType::ListView(f) | DataType::FixedSizeList(f, _) => {
                elements.push(f.data_type().clone())
            }
            DataType::LargeList(f) | DataType::LargeListView(f) => {
                large = true;
                elements.push(f.data_type().clone())
            }
            other => {
                return plan_err!(
                    "{name}: argument {} must be a list (List, LargeList or FixedSizeList), got {other}",
                    i + 1
                );
            }
        }
    }
    let Some(element) = type_union_resolution(&elements) else {
        let shown: Vec<String> = arg_types.iter().map(|t| t.to_string()).collect();
        return plan_err!(
            "{name}: the list arguments have no common element type: {}",
            shown.join(", ")
        );
    };
    Ok(arg_types
        .iter()
        .map(|dt| {
            let field = match dt {
                DataType::Null => return DataType::Null,
                DataType::List(f)
                | DataType::ListView(f)
                | DataType::LargeList(f)
                | DataType::LargeListView(f)
                | DataType::FixedSizeList(f, _) => Arc::new(
                    f.as_ref()
                        .clone()
                        .with_data_type(element.clone())
                        .with_nullable(f.is_nullable()),
                ),
                _ => Arc::new(Field::new_list_field(element.clone(), true)),
            };
            if large {
                DataType::LargeList(field)
            } else {
                DataType::List(field)
            }
        })
        .collect())
}

/// The result type of an intersection over already-coerced arguments: the first non-NULL
/// argument's type (the built-in's rule), `List(Null)` when every argument is NULL.
pub fn first_list_type(arg_types: &[DataType]) -> DataType {
    arg_types
        .iter()
        .find(|t| !t.is_null())
        .cloned()
        .unwrap_or_else(|| DataType::new_list(DataType::Null, true))
}

/// A list column of integers seen through its Arrow buffers: offsets, values and the two
/// validity bitmaps. Rows are read as `&values[offsets[i]..offsets[i + 1]]`, so sliced
/// arrays (first offset ≠ 0, child array with its own offset) need no copy.
pub struct IntLists<'a, O: OffsetSizeTrait, T: SetElem> {
    /// The buffers behind the slices below (for the verdict cache's identity and pins).
    buffers: (&'a Buffer, &'a Buffer, Option<&'a Buffer>),
    offsets: &'a [O],
    values: &'a [T],
    nulls: Option<&'a NullBuffer>,
    /// Child validity, `None` when the child holds no NULL element at all.
    element_nulls: Option<&'a NullBuffer>,
}

impl<'a, O: OffsetSizeTrait, T: SetElem> IntLists<'a, O, T> {
    /// View `list` (a `GenericListArray<O>` whose child is a `PrimitiveArray<P>`).
    pub fn new<P>(list: &'a GenericListArray<O>) -> Self
    where
        P: ArrowPrimitiveType<Native = T>,
        T: ArrowNativeType,
    {
        let child = list.values().as_primitive::<P>();
        let element_nulls = child.nulls().filter(|n| n.null_count() > 0);
        Self {
            buffers: (
                child.values().inner(),
                list.offsets().inner().inner(),
                element_nulls.map(|n| n.buffer()),
            ),
            offsets: list.value_offsets(),
            values: child.values().as_ref(),
            nulls: list.nulls(),
            element_nulls,
        }
    }

    /// The values, offsets and element-validity buffers the view reads (whole buffers; the
    /// view's slices lie inside them).
    pub fn buffers(&self) -> (&'a Buffer, &'a Buffer, Option<&'a Buffer>) {
        self.buffers
    }

    /// The raw parts: offsets (`len() + 1` entries), child values, list validity and child
    /// validity (`None` when the child holds no NULL), for backends that ship whole buffers.
    pub(crate) fn parts(
        &self,
    ) -> (
        &'a [O],
        &'a [T],
        Option<&'a NullBuffer>,
        Option<&'a NullBuffer>,
    ) {
        (self.offsets, self.values, self.nulls, self.element_nulls)
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether the view has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether row `i` is a NULL list.
    #[inline]
    pub fn is_null(&self, i: usize) -> bool {
        self.nulls.is_some_and(|n| n.is_null(i))
    }

    /// Value range of row `i` in the child array.
    #[inline]
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        self.offsets[i].as_usize()..self.offsets[i + 1].as_usize()
    }

    /// The values of row `i` (NULL elements appear as whatever their slot holds).
    #[inline]
    pub fn row(&self, i: usize) -> &'a [T] {
        &self.values[self.range(i)]
    }

    /// Whether row `i` holds at least one NULL element.
    #[inline]
    pub fn row_has_null_element(&self, i: usize) -> bool {
        match self.element_nulls {
            None => false,
            Some(n) => {
                let r = self.range(i);
                r.start != r.end && n.slice(r.start, r.end - r.start).null_count() > 0
            }
        }
    }

    /// Row `i` as `Option`s (NULL elements as `None`), for the exact-semantics path.
    pub fn row_options(&self, i: usize) -> impl Iterator<Item = Option<T>> + '_ {
        let r = self.range(i);
        let vals = &self.values[r.clone()];
        let nulls = self.element_nulls;
        vals.iter().enumerate().map(move |(k, v)| match nulls {
            Some(n) if n.is_null(r.start + k) => None,
            _ => Some(*v),
        })
    }

    /// Total number of values referenced by the rows.
    pub fn total_values(&self) -> usize {
        self.offsets[self.len()].as_usize() - self.offsets[0].as_usize()
    }
}

/// Dispatch `$body` over the integer Arrow type of `$dt`, binding the primitive type to `$P`.
/// Evaluates `$fallback` for any other type.
macro_rules! dispatch_integer {
    ($dt:expr, $P:ident => $body:expr, _ => $fallback:expr) => {{
        use datafusion::arrow::datatypes as adt;
        match $dt {
            adt::DataType::Int8 => {
                type $P = adt::Int8Type;
                $body
            }
            adt::DataType::Int16 => {
                type $P = adt::Int16Type;
                $body
            }
            adt::DataType::Int32 => {
                type $P = adt::Int32Type;
                $body
            }
            adt::DataType::Int64 => {
                type $P = adt::Int64Type;
                $body
            }
            adt::DataType::UInt8 => {
                type $P = adt::UInt8Type;
                $body
            }
            adt::DataType::UInt16 => {
                type $P = adt::UInt16Type;
                $body
            }
            adt::DataType::UInt32 => {
                type $P = adt::UInt32Type;
                $body
            }
            adt::DataType::UInt64 => {
                type $P = adt::UInt64Type;
                $body
            }
            _ => $fallback,
        }
    }};
}

pub(crate) use dispatch_integer;
