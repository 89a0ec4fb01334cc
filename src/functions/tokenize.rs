//! `tokenize(text[, options])`: the terms `bm25_index` would index for `text`, as a list of
//! strings: the index's tokenizer (`search::tokenize`), exposed.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListBuilder, StringBuilder, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion_macros::user_doc;

use super::common::{apply_to_columns, one_value};
use crate::search::tokenize::{Tokenizer, TokenizerOptions};

/// The function's SQL name.
pub const TOKENIZE: &str = "tokenize";

/// The `tokenize` UDF singleton.
pub fn tokenize_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> =
        LazyLock::new(|| Arc::new(ScalarUDF::new_from_impl(Tokenize::new())));
    Arc::clone(&UDF)
}

/// `tokenize(text[, options])` as an [`Expr`]: `args` is `[text]` or `[text, options]`.
pub fn tokenize(args: Vec<Expr>) -> Expr {
    tokenize_udf().call(args)
}

#[user_doc(
    doc_section(label = "String Functions"),
    description = "Splits text into the terms a `bm25_index` built with the same options would index: Unicode words (NFKC, UAX #29 words cut at inner punctuation, lowercased; on ASCII text the same terms as `tokenizer=ascii`), CJK runs as overlapping bigrams, then the options. Returns List(Utf8); NULL text gives NULL, empty text an empty list.",
    syntax_example = "tokenize(text[, options])",
    sql_example = r#"```sql
> select tokenize('Le Café est très bon, 東京タワー!', 'fold=ascii, stopwords=french');
+------------------------------------------------------------------------------------------+
| tokenize(Utf8("Le Café est très bon, 東京タワー!"),Utf8("fold=ascii, stopwords=french")) |
+------------------------------------------------------------------------------------------+
| [cafe, tres, bon, 東京, 京タ, タワ, ワー]                                                |
+------------------------------------------------------------------------------------------+
```"#,
    argument(
        name = "text",
        description = "String expression (Utf8, LargeUtf8 or Utf8View)."
    ),
    argument(
        name = "options",
        description = "Constant string of `key=value` options separated by commas or spaces: `tokenizer=unicode|ascii` (default unicode), `fold=ascii|none`, `stopwords=<language>|none`, `stem=<language>|none` (languages: arabic, danish, dutch, english, finnish, french, german, greek, hungarian, italian, norwegian, portuguese, romanian, russian, spanish, swedish, tamil, turkish), `qgrams=N` (character N-grams of the terms joined by one space, no padding; shorter text gives itself), `shingles=N` (N consecutive terms joined by one space; fewer terms give one shingle of them all)."
    )
)]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Tokenize {
    signature: Signature,
}

impl Default for Tokenize {
    fn default() -> Self {
        Self::new()
    }
}

impl Tokenize {
    /// A new instance (prefer [`tokenize_udf`]).
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
}

fn is_string(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
    )
}

impl ScalarUDFImpl for Tokenize {
    fn name(&self) -> &str {
        TOKENIZE
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if !(1..=2).contains(&arg_types.len()) {
            return plan_err!(
                "{TOKENIZE}: expected 1 or 2 arguments, got {}; usage: {TOKENIZE}(text[, 'options'])",
                arg_types.len()
            );
        }
        if !is_string(&arg_types[0]) {
            return plan_err!(
                "{TOKENIZE}: argument 1 (text) must be a string, got {}",
                arg_types[0]
            );
        }
        if let Some(t) = arg_types.get(1)
            && !is_string(t)
        {
            return plan_err!(
                "{TOKENIZE}: argument 2 (options) must be a constant string, got {t}"
            );
        }
        Ok(arg_types
            .iter()
            .map(|t| match t {
                DataType::Null => DataType::Utf8,
                t => t.clone(),
            })
            .collect())
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(list_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let options = match args.args.get(1).map(one_value).transpose()? {
            None => Some(TokenizerOptions::UNICODE),
            Some(ColumnarValue::Scalar(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::LargeUtf8(Some(s))
                | ScalarValue::Utf8View(Some(s)),
            )) => Some(TokenizerOptions::parse_options(&s, TOKENIZE)?),
            // NULL options: NULL, as NULL text gives.
            Some(ColumnarValue::Scalar(s)) if s.is_null() => None,
            Some(_) => {
                return plan_err!("{TOKENIZE}: argument 2 (options) must be a constant string");
            }
        };
        apply_to_columns(&args.args[..1], |arrays| match options {
            Some(o) => tokenize_array(&arrays[0], o),
            None => Ok(new_null_array(&list_type(), arrays[0].len())),
        })
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.doc()
    }
}

/// Each row's terms (NULL for NULL).
fn tokenize_array(text: &ArrayRef, options: TokenizerOptions) -> Result<ArrayRef> {
    let mut tok = Tokenizer::new(options);
    let mut out = ListBuilder::new(StringBuilder::new());
    let mut row = |s: Option<&str>, out: &mut ListBuilder<StringBuilder>| match s {
        Some(s) => {
            tok.for_each_term(s, |t| out.values().append_value(t));
            out.append(true);
        }
        None => out.append(false),
    };
    match text.data_type() {
        DataType::Utf8 => text
            .as_string::<i32>()
            .iter()
            .for_each(|s| row(s, &mut out)),
        DataType::LargeUtf8 => text
            .as_string::<i64>()
            .iter()
            .for_each(|s| row(s, &mut out)),
        DataType::Utf8View => text.as_string_view().iter().for_each(|s| row(s, &mut out)),
        DataType::Null => (0..text.len()).for_each(|_| row(None, &mut out)),
        t => return exec_err!("{TOKENIZE}: argument 1 (text) must be a string, got {t}"),
    }
    Ok(Arc::new(out.finish()))
}
