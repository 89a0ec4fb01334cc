//! The tokenizer shared by index building and query parsing.
//!
//! A token is a maximal run of ASCII letters and digits after Unicode lowercasing (so `É` is a
//! separator and the Kelvin sign `K` becomes `k`), exactly the `[a-z0-9]+` over `text.lower()`
//! that the shared dataset builders (and PyPI `bm25s`' default pattern on ASCII text) use.
//! Options, recorded in the index so queries are tokenized the way the documents were:
//! - `stopwords=english`: drop the 33 words of Lucene's classic English stop set;
//! - `stem=english`: Snowball's English (Porter 2) stemmer on every token (after stop words).

use std::fmt;

use datafusion::common::{Result, plan_err};
use rust_stemmers::{Algorithm, Stemmer};

/// The classic English stop set (Lucene's `EnglishAnalyzer` default).
const ENGLISH_STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
];

/// How text becomes terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenizerOptions {
    /// Drop English stop words.
    pub stop_words: bool,
    /// Stem with Snowball English.
    pub stem: bool,
}

impl TokenizerOptions {
    /// Parse `key=value` pairs separated by commas or spaces (`''` is the default):
    /// `stopwords=english|none`, `stem=english|none`. `who` names the caller in errors.
    pub fn parse(spec: &str, who: &str) -> Result<Self> {
        let mut o = Self::default();
        for part in spec
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            let Some((k, v)) = part.split_once('=') else {
                return plan_err!(
                    "{who}: tokenizer option '{part}' is not key=value (expected stopwords=english|none, stem=english|none)"
                );
            };
            let on = match v.trim().to_ascii_lowercase().as_str() {
                "english" => true,
                "none" => false,
                other => {
                    return plan_err!(
                        "{who}: tokenizer option {k}: expected 'english' or 'none', got '{other}'"
                    );
                }
            };
            match k.trim().to_ascii_lowercase().as_str() {
                "stopwords" => o.stop_words = on,
                "stem" => o.stem = on,
                other => {
                    return plan_err!(
                        "{who}: unknown tokenizer option '{other}' (expected stopwords, stem)"
                    );
                }
            }
        }
        Ok(o)
    }
}

/// The canonical spelling, stored in the index and parsed back by [`TokenizerOptions::parse`].
impl fmt::Display for TokenizerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |on| if on { "english" } else { "none" };
        write!(
            f,
            "stopwords={},stem={}",
            word(self.stop_words),
            word(self.stem)
        )
    }
}

/// A tokenizer with its stemmer built once.
pub struct Tokenizer {
    options: TokenizerOptions,
    stemmer: Option<Stemmer>,
    buf: String,
}

impl Tokenizer {
    pub fn new(options: TokenizerOptions) -> Self {
        Self {
            options,
            stemmer: options.stem.then(|| Stemmer::create(Algorithm::English)),
            buf: String::new(),
        }
    }

    /// Call `emit` with every term of `text`, in order (repeats included).
    pub fn for_each_term(&mut self, text: &str, mut emit: impl FnMut(&str)) {
        let push = |buf: &mut String, emit: &mut dyn FnMut(&str)| {
            if buf.is_empty() {
                return;
            }
            if !(self.options.stop_words && ENGLISH_STOP_WORDS.contains(&buf.as_str())) {
                match &self.stemmer {
                    Some(s) => emit(&s.stem(buf)),
                    None => emit(buf),
                }
            }
            buf.clear();
        };
        let buf = &mut self.buf;
        buf.clear();
        for c in text.chars() {
            if c.is_ascii() {
                if c.is_ascii_alphanumeric() {
                    buf.push(c.to_ascii_lowercase());
                } else {
                    push(buf, &mut emit);
                }
            } else {
                for l in c.to_lowercase() {
                    if l.is_ascii_alphanumeric() {
                        buf.push(l);
                    } else {
                        push(buf, &mut emit);
                    }
                }
            }
        }
        push(buf, &mut emit);
    }

    /// The terms of `text`, in order.
    pub fn terms(&mut self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.for_each_term(text, |t| out.push(t.to_string()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_digits_case_and_separators() {
        let mut t = Tokenizer::new(TokenizerOptions::default());
        assert_eq!(
            t.terms("The quick-brown FOX, 42 times: x2y!"),
            ["the", "quick", "brown", "fox", "42", "times", "x2y"]
        );
        // Non-ASCII letters separate; the Kelvin sign lowercases to an ASCII k.
        assert_eq!(t.terms("café\u{212A}m naïve"), ["caf", "km", "na", "ve"]);
        assert!(t.terms("").is_empty());
        assert!(t.terms(" ,;- ").is_empty());
    }

    #[test]
    fn stop_words_and_stemming() {
        let o = TokenizerOptions::parse("stopwords=english, stem=english", "t").unwrap();
        let mut t = Tokenizer::new(o);
        assert_eq!(
            t.terms("The running of the dogs is over"),
            ["run", "dog", "over"]
        );
        let o = TokenizerOptions::parse("stopwords=english", "t").unwrap();
        assert_eq!(Tokenizer::new(o).terms("the running"), ["running"]);
    }

    #[test]
    fn options_round_trip_and_errors() {
        for o in [
            TokenizerOptions::default(),
            TokenizerOptions {
                stop_words: true,
                stem: false,
            },
            TokenizerOptions {
                stop_words: true,
                stem: true,
            },
        ] {
            assert_eq!(TokenizerOptions::parse(&o.to_string(), "t").unwrap(), o);
        }
        assert_eq!(
            TokenizerOptions::parse("", "t").unwrap(),
            TokenizerOptions::default()
        );
        for bad in ["stem", "stem=french", "colour=blue"] {
            let e = TokenizerOptions::parse(bad, "bm25_index")
                .unwrap_err()
                .to_string();
            assert!(e.contains("bm25_index"), "{e}");
        }
    }
}
