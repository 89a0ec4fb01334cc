//! The tokenizer shared by index building, query parsing and the `tokenize` SQL function.
//!
//! Two tokenizers, chosen by `tokenizer=`:
//!
//! - `unicode` (the default of new indexes): NFKC, then words by Unicode's UAX #29, each cut at
//!   the punctuation UAX #29 allows inside words (`'`, `.`, `:`, `_`, `·`, ...), lowercased
//!   (Unicode's full lowercasing): a term is a run of letters, digits and marks within a UAX #29
//!   word (see [`unicode`]). So `don't` is `don` and `t`, `3.14` is `3` and `14`, `mod_ssl` is
//!   `mod` and `ssl`, `l'homme` is `l` and `homme`: on ASCII text exactly the terms of the
//!   `ascii` tokenizer, so English indexes built before and after it agree. Han, Hiragana,
//!   Katakana and Hangul runs become overlapping bigrams (`東京都`: `東京`, `京都`; a lone CJK
//!   character stays itself), as Lucene's `CJKBigramFilter` does, so CJK text is searchable
//!   with no dictionary. Emoji and punctuation are no words. ASCII pieces of text take a byte
//!   loop and skip NFKC.
//! - `ascii`: a token is a maximal run of ASCII letters and digits after Unicode lowercasing (so
//!   `É` is a separator and the Kelvin sign `K` becomes `k`), exactly the `[a-z0-9]+` over
//!   `text.lower()` that the shared dataset builders (and PyPI `bm25s`' default pattern on ASCII
//!   text) use. Every index built before the Unicode tokenizer is one of these.
//!
//! Options, recorded in the index so queries are tokenized the way the documents were, applied
//! to each word in this order (CJK terms are left as they are):
//! - `fold=ascii`: remove diacritics (see [`unicode::fold_into`]): `café` is `cafe`;
//! - `stopwords=<language>`: drop the language's stop words (compared after folding);
//! - `stem=<language>`: Snowball's stemmer of the language (on the folded word, so that folded
//!   and unfolded spellings stem alike);
//! - `qgrams=N`: instead of terms, the character N-grams of the terms joined by one space (CJK
//!   runs whole), with no padding; text shorter than N gives one gram, itself; no terms, none;
//! - `shingles=N`: instead of terms, every N consecutive terms joined by one space; fewer than N
//!   terms give one shingle of them all; no terms, none.
//!
//! Languages are Snowball's ([`Language`]); `english` stop words are Lucene's classic 33.
//!
//! Spelling: `key=value` pairs separated by commas or spaces. The canonical spelling, recorded
//! in the index, names every key: `tokenizer=unicode,fold=none,stopwords=none,stem=none` (and
//! `qgrams=N` or `shingles=N` when set). A recorded spelling with no `tokenizer=` key is an
//! index from before the Unicode tokenizer: `ascii` ([`TokenizerOptions::parse`]).

mod language;
pub mod unicode;

use std::fmt;

use datafusion::common::{Result, plan_err};
use foldhash::{HashSet, HashSetExt};
use rust_stemmers::Stemmer;

pub use language::Language;
pub use unicode::uax29_words;

/// Which tokenizer (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// `[a-z0-9]+` after lowercasing: every index built before the Unicode tokenizer.
    #[default]
    Ascii,
    /// UAX #29 words, NFKC, lowercasing, CJK bigrams.
    Unicode,
}

impl TokenizerKind {
    fn name(self) -> &'static str {
        match self {
            TokenizerKind::Ascii => "ascii",
            TokenizerKind::Unicode => "unicode",
        }
    }
}

/// Terms, or grams of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Grams {
    /// The terms themselves.
    #[default]
    None,
    /// `qgrams=N`: character N-grams of the terms joined by one space.
    Chars(u8),
    /// `shingles=N`: N consecutive terms joined by one space.
    Words(u8),
}

/// The largest N of `qgrams=N` and `shingles=N`.
pub const MAX_GRAM: u8 = 64;

/// How text becomes terms.
///
/// `Default` is what an index that records no options means: the ASCII tokenizer, no
/// folding, stop words or stemming. New indexes default to [`TokenizerOptions::UNICODE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenizerOptions {
    /// The tokenizer.
    pub kind: TokenizerKind,
    /// Remove diacritics (`fold=ascii`); no effect on the ASCII tokenizer's terms.
    pub fold: bool,
    /// Drop this language's stop words.
    pub stop_words: Option<Language>,
    /// Stem with this language's Snowball stemmer.
    pub stem: Option<Language>,
    /// Grams of the terms instead of the terms.
    pub grams: Grams,
}

const EXPECTED: &str = "tokenizer=unicode|ascii, fold=ascii|none, stopwords=<language>|none, \
                        stem=<language>|none, qgrams=N, shingles=N";

impl TokenizerOptions {
    /// The ASCII tokenizer with no options (what [`Default`] gives).
    pub const ASCII: Self = Self {
        kind: TokenizerKind::Ascii,
        fold: false,
        stop_words: None,
        stem: None,
        grams: Grams::None,
    };

    /// The Unicode tokenizer with no options: what `bm25_index` and `tokenize` use by default.
    pub const UNICODE: Self = Self {
        kind: TokenizerKind::Unicode,
        ..Self::ASCII
    };

    /// Parse a spelling recorded in an index (or any spelling in which a missing `tokenizer=`
    /// means `ascii`, as in every index from before the Unicode tokenizer). `''` is
    /// [`Default`]. `who` names the caller in errors.
    pub fn parse(spec: &str, who: &str) -> Result<Self> {
        Self::parse_over(Self::ASCII, spec, who)
    }

    /// Parse the options a user gives `bm25_index` or `tokenize`: keys left out take the values
    /// of [`TokenizerOptions::UNICODE`].
    pub fn parse_options(spec: &str, who: &str) -> Result<Self> {
        Self::parse_over(Self::UNICODE, spec, who)
    }

    fn parse_over(base: Self, spec: &str, who: &str) -> Result<Self> {
        let mut o = base;
        for part in spec
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            let Some((k, v)) = part.split_once('=') else {
                return plan_err!(
                    "{who}: tokenizer option '{part}' is not key=value (expected {EXPECTED})"
                );
            };
            let key = k.trim().to_ascii_lowercase();
            let value = v.trim().to_ascii_lowercase();
            let language = || -> Result<Option<Language>> {
                if value == "none" {
                    return Ok(None);
                }
                match Language::from_name(&value) {
                    Some(l) => Ok(Some(l)),
                    None => plan_err!(
                        "{who}: tokenizer option {key}: unknown language '{value}' (expected none or one of {})",
                        Language::names()
                    ),
                }
            };
            let gram = || -> Result<u8> {
                match value.parse::<u8>() {
                    Ok(n) if (1..=MAX_GRAM).contains(&n) => Ok(n),
                    _ => plan_err!(
                        "{who}: tokenizer option {key}: expected a whole number from 1 to {MAX_GRAM}, got '{value}'"
                    ),
                }
            };
            match key.as_str() {
                "tokenizer" => {
                    o.kind = match value.as_str() {
                        "unicode" => TokenizerKind::Unicode,
                        "ascii" => TokenizerKind::Ascii,
                        _ => {
                            return plan_err!(
                                "{who}: tokenizer option tokenizer: expected 'unicode' or 'ascii', got '{value}'"
                            );
                        }
                    }
                }
                "fold" => {
                    o.fold = match value.as_str() {
                        "ascii" => true,
                        "none" => false,
                        _ => {
                            return plan_err!(
                                "{who}: tokenizer option fold: expected 'ascii' or 'none', got '{value}'"
                            );
                        }
                    }
                }
                "stopwords" => o.stop_words = language()?,
                "stem" => o.stem = language()?,
                "qgrams" | "shingles" => {
                    let n = gram()?;
                    let new = if key == "qgrams" {
                        Grams::Chars(n)
                    } else {
                        Grams::Words(n)
                    };
                    if matches!(
                        (o.grams, new),
                        (Grams::Chars(_), Grams::Words(_)) | (Grams::Words(_), Grams::Chars(_))
                    ) {
                        return plan_err!(
                            "{who}: tokenizer options qgrams and shingles exclude each other"
                        );
                    }
                    o.grams = new;
                }
                other => {
                    return plan_err!(
                        "{who}: unknown tokenizer option '{other}' (expected {EXPECTED})"
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
        let lang = |l: Option<Language>| l.map_or("none", Language::name);
        write!(
            f,
            "tokenizer={},fold={},stopwords={},stem={}",
            self.kind.name(),
            if self.fold { "ascii" } else { "none" },
            lang(self.stop_words),
            lang(self.stem)
        )?;
        match self.grams {
            Grams::None => Ok(()),
            Grams::Chars(n) => write!(f, ",qgrams={n}"),
            Grams::Words(n) => write!(f, ",shingles={n}"),
        }
    }
}

/// What happens to each word once found: lowercasing, folding, stop words, stemming.
struct WordFilter {
    fold: bool,
    stemmer: Option<Stemmer>,
    /// The stop words, lowercased, normalized and (with `fold`) folded like words are.
    stop: HashSet<String>,
    lower: String,
    folded: String,
}

impl WordFilter {
    fn new(options: TokenizerOptions) -> Self {
        let mut f = Self {
            fold: options.fold && options.kind == TokenizerKind::Unicode,
            stemmer: options.stem.map(|l| Stemmer::create(l.algorithm())),
            stop: HashSet::new(),
            lower: String::new(),
            folded: String::new(),
        };
        if let Some(l) = options.stop_words {
            for w in l.stop_words() {
                let w = unicode::nfkc(w).to_lowercase();
                if f.fold {
                    unicode::fold_into(&w, &mut f.folded);
                    f.stop.insert(f.folded.clone());
                } else {
                    f.stop.insert(w);
                }
            }
        }
        f
    }

    /// A term that is lowercase already (in `self.lower`): stop words, stemming.
    fn finish(&mut self, emit: &mut dyn FnMut(&str)) {
        let mut term = self.lower.as_str();
        if self.fold && !term.is_ascii() {
            unicode::fold_into(term, &mut self.folded);
            term = &self.folded;
        }
        if !self.stop.is_empty() && self.stop.contains(term) {
            return;
        }
        match &self.stemmer {
            Some(s) => emit(&s.stem(term)),
            None => emit(term),
        }
    }

    /// A word (letters, digits, marks): lowercased and finished.
    fn word(&mut self, word: &str, emit: &mut dyn FnMut(&str)) {
        if word.is_ascii() {
            self.lower.clear();
            self.lower
                .extend(word.bytes().map(|b| b.to_ascii_lowercase() as char));
        } else {
            self.lower = word.to_lowercase();
        }
        self.finish(emit);
    }
}

/// A tokenizer with its stemmer and stop words ready.
pub struct Tokenizer {
    options: TokenizerOptions,
    words: WordFilter,
    /// The CJK run being built.
    run: String,
    /// The terms of one text, when grams are made of them.
    terms: Vec<String>,
    gram: String,
    /// Take the shortcuts (pieces at whitespace, the ASCII byte loop); off only in tests.
    shortcuts: bool,
}

impl Tokenizer {
    pub fn new(options: TokenizerOptions) -> Self {
        Self {
            options,
            words: WordFilter::new(options),
            run: String::new(),
            terms: Vec::new(),
            gram: String::new(),
            shortcuts: true,
        }
    }

    /// The options this tokenizer was made with.
    pub fn options(&self) -> TokenizerOptions {
        self.options
    }

    /// This tokenizer without the Unicode tokenizer's shortcuts: every text normalized whole and
    /// segmented by `unicode-segmentation` alone. The same terms, slower; for tests that check
    /// the shortcuts change nothing.
    #[doc(hidden)]
    pub fn without_shortcuts(mut self) -> Self {
        self.shortcuts = false;
        self
    }

    /// Call `emit` with every term of `text`, in order (repeats included).
    pub fn for_each_term(&mut self, text: &str, mut emit: impl FnMut(&str)) {
        match self.options.grams {
            Grams::None => self.base_terms(text, true, &mut emit),
            Grams::Words(n) => {
                let mut terms = std::mem::take(&mut self.terms);
                terms.clear();
                self.base_terms(text, true, &mut |t| terms.push(t.to_string()));
                let n = (n as usize).min(terms.len());
                if n > 0 {
                    for w in terms.windows(n) {
                        self.gram.clear();
                        for (i, t) in w.iter().enumerate() {
                            if i > 0 {
                                self.gram.push(' ');
                            }
                            self.gram.push_str(t);
                        }
                        emit(&self.gram);
                    }
                }
                self.terms = terms;
            }
            Grams::Chars(n) => {
                let mut joined = std::mem::take(&mut self.gram);
                joined.clear();
                self.base_terms(text, false, &mut |t| {
                    if !joined.is_empty() {
                        joined.push(' ');
                    }
                    joined.push_str(t);
                });
                let bounds: Vec<usize> = joined
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain(std::iter::once(joined.len()))
                    .collect();
                let chars = bounds.len() - 1;
                let n = (n as usize).min(chars);
                if n > 0 {
                    for w in bounds.windows(n + 1) {
                        emit(&joined[w[0]..w[n]]);
                    }
                }
                self.gram = joined;
            }
        }
    }

    /// The terms before grams; CJK runs as bigrams or (`bigrams` false) whole.
    fn base_terms(&mut self, text: &str, bigrams: bool, emit: &mut dyn FnMut(&str)) {
        match self.options.kind {
            TokenizerKind::Ascii => self.ascii_terms(text, emit),
            TokenizerKind::Unicode => self.unicode_terms(text, bigrams, emit),
        }
    }

    /// The ASCII tokenizer: maximal runs of `[a-z0-9]` after lowercasing.
    fn ascii_terms(&mut self, text: &str, emit: &mut dyn FnMut(&str)) {
        let words = &mut self.words;
        let push = |words: &mut WordFilter, emit: &mut dyn FnMut(&str)| {
            if !words.lower.is_empty() {
                words.finish(emit);
                words.lower.clear();
            }
        };
        words.lower.clear();
        for c in text.chars() {
            if c.is_ascii() {
                if c.is_ascii_alphanumeric() {
                    words.lower.push(c.to_ascii_lowercase());
                } else {
                    push(words, emit);
                }
            } else {
                for l in c.to_lowercase() {
                    if l.is_ascii_alphanumeric() {
                        words.lower.push(l);
                    } else {
                        push(words, emit);
                    }
                }
            }
        }
        push(words, emit);
    }

    fn unicode_terms(&mut self, text: &str, bigrams: bool, emit: &mut dyn FnMut(&str)) {
        let Self {
            words,
            run,
            shortcuts,
            ..
        } = self;
        let mut unit = |u: unicode::Unit<'_>| match u {
            unicode::Unit::Word(w) => words.word(w, emit),
            unicode::Unit::Cjk(r) => unicode::cjk_terms(r, bigrams, emit),
        };
        if !*shortcuts {
            unicode::for_each_unit(&unicode::nfkc(text), true, run, &mut unit);
        } else if text.is_ascii() {
            unicode::ascii_words(text, |w| unit(unicode::Unit::Word(w)));
        } else {
            unicode::for_each_piece(text, |piece| {
                if piece.is_ascii() {
                    unicode::ascii_words(piece, |w| unit(unicode::Unit::Word(w)));
                } else {
                    unicode::for_each_unit(&unicode::nfkc(piece), true, run, &mut unit);
                }
            });
        }
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

    fn terms(spec: &str, text: &str) -> Vec<String> {
        let o = TokenizerOptions::parse_options(spec, "t").unwrap();
        let fast = Tokenizer::new(o).terms(text);
        let slow = Tokenizer::new(o).without_shortcuts().terms(text);
        assert_eq!(
            fast, slow,
            "shortcuts changed the terms of {text:?} ({spec})"
        );
        fast
    }

    #[test]
    fn ascii_words_digits_case_and_separators() {
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
    fn ascii_stop_words_and_stemming() {
        let o = TokenizerOptions::parse("stopwords=english, stem=english", "t").unwrap();
        assert_eq!(o.kind, TokenizerKind::Ascii);
        let mut t = Tokenizer::new(o);
        assert_eq!(
            t.terms("The running of the dogs is over"),
            ["run", "dog", "over"]
        );
        let o = TokenizerOptions::parse("stopwords=english", "t").unwrap();
        assert_eq!(Tokenizer::new(o).terms("the running"), ["running"]);
    }

    #[test]
    fn unicode_words() {
        assert_eq!(
            terms("", "The quick-brown FOX, 42 times: x2y!"),
            ["the", "quick", "brown", "fox", "42", "times", "x2y"]
        );
        assert_eq!(
            terms("", "Don't stop: 3.14, e.g. foo_bar a:b"),
            [
                "don", "t", "stop", "3", "14", "e", "g", "foo", "bar", "a", "b"
            ]
        );
        // On ASCII text, the ASCII tokenizer's terms.
        let text = "It's 3.14, e.g. mod_ssl & ASP.NET (v5.3) -- a:b; x_y 'q' __init__ 1,000";
        assert_eq!(
            terms("", text),
            Tokenizer::new(TokenizerOptions::ASCII).terms(text)
        );
        assert_eq!(
            terms("", "Le café est très bon"),
            ["le", "café", "est", "très", "bon"]
        );
        assert_eq!(terms("", "Straße und MÜLLER"), ["straße", "und", "müller"]);
        // NFKC: full-width letters, the ligature, the Kelvin sign.
        assert_eq!(terms("", "ＡＢＣ ﬁne \u{212A}"), ["abc", "fine", "k"]);
        // Decomposed and composed spellings are one term.
        assert_eq!(terms("", "cafe\u{301}"), terms("", "café"));
        // Greek final sigma; Cyrillic.
        assert_eq!(terms("", "ΟΔΟΣ Москва"), ["οδος", "москва"]);
        assert_eq!(
            terms("", "l'homme aujourd’hui"),
            ["l", "homme", "aujourd", "hui"]
        );
        assert!(terms("", "👍🏽 ... ¿? ").is_empty());
        assert!(terms("", "").is_empty());
    }

    #[test]
    fn cjk_bigrams() {
        assert_eq!(terms("", "東京 タワー"), ["東京", "タワ", "ワー"]);
        assert_eq!(
            terms("", "東京都に行く"),
            ["東京", "京都", "都に", "に行", "行く"]
        );
        assert_eq!(terms("", "東"), ["東"]);
        assert_eq!(terms("", "한국어 문장"), ["한국", "국어", "문장"]);
        assert_eq!(
            terms("", "Tokyo東京2024年"),
            ["tokyo", "東京", "2024", "年"]
        );
        // Half-width katakana is normalized to full width.
        assert_eq!(terms("", "ﾀﾜｰ"), terms("", "タワー"));
    }

    #[test]
    fn unicode_options() {
        assert_eq!(terms("fold=ascii", "Café Straße"), ["cafe", "strasse"]);
        assert_eq!(terms("fold=ascii", "東京 ガス"), ["東京", "ガス"]);
        assert_eq!(
            terms("stopwords=french", "Le café est très bon"),
            ["café", "très", "bon"]
        );
        // Stop words are folded like words.
        assert_eq!(terms("stopwords=french,fold=ascii", "été bon"), ["bon"]);
        assert_eq!(
            terms("stem=german", "Häuser Häusern"),
            terms("stem=german", "Häuser Häuser")
        );
        assert_eq!(terms("stem=russian", "книги книгами"), ["книг", "книг"]);
        assert_eq!(
            terms("stopwords=english,stem=english", "The running of the dogs"),
            ["run", "dog"]
        );
    }

    #[test]
    fn grams() {
        assert_eq!(terms("qgrams=3", "Ab cd"), ["ab ", "b c", " cd"]);
        assert_eq!(terms("qgrams=3", "ab"), ["ab"]);
        assert_eq!(terms("qgrams=2", "東京"), ["東京"]);
        assert!(terms("qgrams=3", " ").is_empty());
        assert_eq!(
            terms("shingles=2", "one two three"),
            ["one two", "two three"]
        );
        assert_eq!(terms("shingles=3", "one two"), ["one two"]);
        assert!(terms("shingles=2", "").is_empty());
        assert_eq!(terms("shingles=1", "a b"), ["a", "b"]);
    }

    #[test]
    fn options_round_trip_and_errors() {
        let all = [
            TokenizerOptions::default(),
            TokenizerOptions::UNICODE,
            TokenizerOptions {
                stop_words: Some(Language::English),
                ..TokenizerOptions::ASCII
            },
            TokenizerOptions {
                fold: true,
                stop_words: Some(Language::French),
                stem: Some(Language::Turkish),
                grams: Grams::Words(2),
                ..TokenizerOptions::UNICODE
            },
            TokenizerOptions {
                grams: Grams::Chars(3),
                ..TokenizerOptions::UNICODE
            },
        ];
        for o in all {
            assert_eq!(TokenizerOptions::parse(&o.to_string(), "t").unwrap(), o);
            assert_eq!(
                TokenizerOptions::parse_options(&o.to_string(), "t").unwrap(),
                o
            );
        }
        // What older indexes record means the ASCII tokenizer.
        assert_eq!(
            TokenizerOptions::parse("stopwords=none,stem=none", "t").unwrap(),
            TokenizerOptions::ASCII
        );
        assert_eq!(
            TokenizerOptions::parse("stopwords=english,stem=english", "t").unwrap(),
            TokenizerOptions {
                stop_words: Some(Language::English),
                stem: Some(Language::English),
                ..TokenizerOptions::ASCII
            }
        );
        assert_eq!(
            TokenizerOptions::parse_options("", "t").unwrap(),
            TokenizerOptions::UNICODE
        );
        assert_eq!(
            TokenizerOptions::UNICODE.to_string(),
            "tokenizer=unicode,fold=none,stopwords=none,stem=none"
        );
        for (bad, says) in [
            ("stem", "is not key=value"),
            ("stem=latin", "stem: unknown language 'latin'"),
            ("stopwords=klingon", "stopwords: unknown language"),
            ("colour=blue", "unknown tokenizer option 'colour'"),
            ("tokenizer=icu", "tokenizer: expected 'unicode' or 'ascii'"),
            ("fold=yes", "fold: expected 'ascii' or 'none'"),
            ("qgrams=0", "qgrams: expected a whole number from 1 to 64"),
            ("shingles=65", "shingles: expected a whole number"),
            ("qgrams=x", "qgrams: expected"),
            ("qgrams=2,shingles=2", "exclude each other"),
        ] {
            let e = TokenizerOptions::parse_options(bad, "bm25_index")
                .unwrap_err()
                .to_string();
            assert!(e.contains("bm25_index") && e.contains(says), "{bad}: {e}");
        }
    }
}
