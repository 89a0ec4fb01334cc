//! Arguments of the crate's table functions: literals (possibly negated or cast), strings,
//! integers (table names are resolved by `crate::catalog`), with errors that name the
//! function, the argument's position and what it is for.

use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::Expr;

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
