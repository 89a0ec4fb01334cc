//! The pieces of the Unicode tokenizer: word boundaries (UAX #29, with a byte loop for ASCII),
//! CJK runs, folding.
//!
//! Word boundaries are `unicode-segmentation`'s UAX #29 segments; a word is a segment holding
//! a letter or digit (`char::is_alphanumeric`), as `unicode_words` keeps. Two shortcuts give
//! the same words, both checked against Unicode's `WordBreakTest.txt` and against the plain
//! algorithm on real text (tests/tokenizer_real_data.rs):
//! - text is cut at every ASCII whitespace byte followed by an ASCII byte: UAX #29 always has a
//!   boundary there (no rule joins a space, tab or newline to a following ASCII character), and
//!   NFKC cannot compose across it (ASCII characters are starters that compose with nothing
//!   before them), so each piece is normalized and segmented alone;
//! - an all-ASCII piece is segmented by [`ascii_words`], a byte loop implementing the rules of
//!   UAX #29 that ASCII can meet (WB5 to WB13b), and skips NFKC (ASCII is NFKC already).
//!
//! Scripts: a CJK letter is an alphanumeric character whose Script_Extensions (UAX #24, from
//! `unicode-script`) include Han, Hiragana, Katakana or Hangul. Script_Extensions rather than
//! Script, so that `ー` (U+30FC, Script=Common) and `々` count with the kana and kanji they
//! extend.

use unicode_normalization::char::decompose_compatible;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
use unicode_script::{Script, UnicodeScript};
use unicode_segmentation::UnicodeSegmentation;

/// Calls `f` with every piece of `text` between ASCII whitespace bytes that are followed by an
/// ASCII byte (or end the text); empty pieces are skipped.
pub(super) fn for_each_piece<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let b = text.as_bytes();
    let mut start = 0;
    for i in 0..b.len() {
        if b[i].is_ascii_whitespace() && b.get(i + 1).is_none_or(|n| n.is_ascii()) {
            if start < i {
                f(&text[start..i]);
            }
            start = i + 1;
        }
    }
    if start < b.len() {
        f(&text[start..]);
    }
}

/// Word_Break classes of the ASCII characters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wb {
    /// Everything that joins nothing (spaces, most punctuation).
    Other,
    /// ALetter: `A-Z a-z`.
    Letter,
    /// Numeric: `0-9`.
    Digit,
    /// ExtendNumLet: `_`.
    Under,
    /// MidLetter: `:`.
    MidLetter,
    /// MidNumLet and Single_Quote: `.` and `'`.
    MidNumLet,
    /// MidNum: `,` and `;`.
    MidNum,
}

const fn wb_table() -> [Wb; 128] {
    let mut t = [Wb::Other; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = if b.is_ascii_alphabetic() {
            Wb::Letter
        } else if b.is_ascii_digit() {
            Wb::Digit
        } else {
            match b {
                b'_' => Wb::Under,
                b':' => Wb::MidLetter,
                b'.' | b'\'' => Wb::MidNumLet,
                b',' | b';' => Wb::MidNum,
                _ => Wb::Other,
            }
        };
        c += 1;
    }
    t
}

static WB: [Wb; 128] = wb_table();

/// The UAX #29 words of an all-ASCII `text`, in order: what `unicode_words` returns, by a byte
/// loop. Letters, digits and `_` always join (WB5, WB8 to WB10, WB13a/b); `:`, `.` and `'`
/// join two letters (WB6/7); `.`, `'`, `,` and `;` join two digits (WB11/12). A segment of
/// `_` alone is not a word.
pub(super) fn ascii_words<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    debug_assert!(text.is_ascii());
    let b = text.as_bytes();
    let class = |i: usize| WB[(b[i] & 0x7f) as usize];
    let n = b.len();
    let mut i = 0;
    while i < n {
        let c = class(i);
        if !matches!(c, Wb::Letter | Wb::Digit | Wb::Under) {
            i += 1;
            continue;
        }
        let start = i;
        let mut alnum = c != Wb::Under;
        let mut prev = c;
        i += 1;
        while i < n {
            let c = class(i);
            match c {
                Wb::Letter | Wb::Digit | Wb::Under => {
                    alnum |= c != Wb::Under;
                    prev = c;
                    i += 1;
                }
                Wb::MidLetter | Wb::MidNumLet | Wb::MidNum if i + 1 < n => {
                    let next = class(i + 1);
                    let joins = match (prev, next) {
                        (Wb::Letter, Wb::Letter) => c != Wb::MidNum,
                        (Wb::Digit, Wb::Digit) => c != Wb::MidLetter,
                        _ => false,
                    };
                    if !joins {
                        break;
                    }
                    prev = next;
                    i += 2;
                }
                _ => break,
            }
        }
        if alnum {
            f(&text[start..i]);
        }
    }
}

/// The UAX #29 words of `text` as the tokenizer finds them (pieces, ASCII by the byte loop,
/// the rest by `unicode-segmentation`), without normalization, lowercasing or CJK handling.
pub fn uax29_words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for_each_piece(text, |piece| {
        if piece.is_ascii() {
            ascii_words(piece, |w| out.push(w));
        } else {
            out.extend(piece.unicode_words());
        }
    });
    out
}

/// `text` in NFKC: borrowed when the quick check says it is already.
pub(super) fn nfkc(text: &str) -> std::borrow::Cow<'_, str> {
    if is_nfkc_quick(text.chars()) == IsNormalized::Yes {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(text.nfkc().collect())
    }
}

/// Whether `c` is a letter of a CJK script (see the module docs).
pub(super) fn is_cjk_letter(c: char) -> bool {
    // Nothing below U+1100 (Hangul Jamo) is Han, kana or Hangul.
    if (c as u32) < 0x1100 || !c.is_alphanumeric() {
        return false;
    }
    let scx = c.script_extension();
    [Script::Han, Script::Hiragana, Script::Katakana, Script::Hangul]
        .into_iter()
        .any(|s| scx.contains_script(s))
}

/// A word or a CJK run, before lowercasing.
pub(super) enum Unit<'a> {
    /// A UAX #29 word (or the non-CJK part of one), apostrophes included.
    Word(&'a str),
    /// A run of CJK letters, adjacent in the text (marks between them left out).
    Cjk(&'a str),
}

/// Calls `f` with the words and CJK runs of `text` (normalized already), in order.
///
/// A word segment is cut where CJK letters start or stop; the characters of a segment that are
/// not letters or digits (marks, joiners like `'` or `_`) stay in the word they are in, and
/// after a CJK letter are left out. A run goes on across segments (UAX #29 makes each Han
/// character and each hiragana a segment of its own) until a segment with no letter or digit,
/// or a non-CJK word, comes between.
pub(super) fn for_each_unit(text: &str, run: &mut String, f: &mut dyn FnMut(Unit<'_>)) {
    run.clear();
    let flush = |run: &mut String, f: &mut dyn FnMut(Unit<'_>)| {
        if !run.is_empty() {
            f(Unit::Cjk(run));
            run.clear();
        }
    };
    for seg in text.split_word_bounds() {
        if !seg.chars().any(char::is_alphanumeric) {
            flush(run, f);
            continue;
        }
        let mut word: Option<usize> = None;
        let mut after_cjk = false;
        for (i, c) in seg.char_indices() {
            if is_cjk_letter(c) {
                if let Some(s) = word.take() {
                    f(Unit::Word(&seg[s..i]));
                }
                run.push(c);
                after_cjk = true;
            } else if word.is_some() || (after_cjk && !c.is_alphanumeric()) {
                // Inside a word, or a mark after a CJK letter (left out).
            } else {
                flush(run, f);
                word = Some(i);
                after_cjk = false;
            }
        }
        if let Some(s) = word {
            f(Unit::Word(&seg[s..]));
        }
    }
    flush(run, f);
}

/// The CJK run's terms: overlapping bigrams, or the character alone when the run has one
/// (Lucene's `CJKBigramFilter`); with `bigrams` false the run whole.
pub(super) fn cjk_terms(run: &str, bigrams: bool, emit: &mut dyn FnMut(&str)) {
    let mut bounds = run
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(run.len()))
        .skip(1);
    let Some(mut b) = bounds.next() else {
        return;
    };
    if b == run.len() || !bigrams {
        emit(run);
        return;
    }
    let mut a = 0;
    for c in bounds {
        emit(&run[a..c]);
        (a, b) = (b, c);
    }
}

/// `word` (lower case) with its diacritics removed, appended to `out`: each character
/// decomposed (NFKD), its nonspacing marks (General_Category Mn) dropped, a few letters that
/// do not decompose spelled in ASCII (`ß` ss, `æ` ae, `œ` oe, `ø` o, `ł` l, `đ` d, `ð` d,
/// `þ` th, `ı` i, `ħ` h, `ŧ` t), and what is left recomposed (NFC).
pub(super) fn fold_into(word: &str, out: &mut String) {
    out.clear();
    for c in word.chars() {
        if c.is_ascii() {
            out.push(c);
            continue;
        }
        let spelled = match c {
            'ß' => "ss",
            'æ' => "ae",
            'œ' => "oe",
            'ø' => "o",
            'ł' => "l",
            'đ' | 'ð' => "d",
            'þ' => "th",
            'ı' => "i",
            'ħ' => "h",
            'ŧ' => "t",
            _ => "",
        };
        if !spelled.is_empty() {
            out.push_str(spelled);
            continue;
        }
        decompose_compatible(c, |d| {
            if d.general_category() != GeneralCategory::NonspacingMark {
                out.push(d);
            }
        });
    }
    if !out.is_ascii() && is_nfkc_quick(out.chars()) != IsNormalized::Yes {
        *out = out.nfc().collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_words(text: &str) -> Vec<&str> {
        text.unicode_words().collect()
    }

    #[test]
    fn ascii_loop_agrees_with_the_crate() {
        let cases = [
            "The quick-brown FOX, 42 times: x2y!",
            "don't 3.14 1,000,000 e.g. U.S.A. a:b a::b foo_bar _x_ __ x_1 1_x",
            "a.1 1.a a'1 1'2 a'.b a.'b 'quoted' end. 1. .5 ,5 a, b; c: d",
            "http://example.com/a_b?c=d&e=f#g mail@host.org 10:30 3.14.15 ...",
            "tab\there\nnew\r\nline\x0bvt\x0cff  two  spaces _ __a__ a__ __",
            "",
            "'",
            "_",
            "a",
            "9",
        ];
        for text in cases {
            let mut ours = Vec::new();
            ascii_words(text, |w| ours.push(w));
            assert_eq!(ours, crate_words(text), "{text:?}");
            assert_eq!(uax29_words(text), crate_words(text), "{text:?}");
        }
        // Every two- and three-character string over a class-covering alphabet.
        let alphabet = ['a', 'Z', '0', '_', ':', '.', '\'', ',', ';', ' ', '-', '\n'];
        let mut s = String::new();
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    for d in alphabet {
                        s.clear();
                        s.extend([a, b, c, d]);
                        let mut ours = Vec::new();
                        ascii_words(&s, |w| ours.push(w));
                        assert_eq!(ours, crate_words(&s), "{s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn pieces_keep_the_crates_words() {
        for text in [
            "café au lait, naïve  résumé",
            "東京 タワー\tは 高い。",
            "a \u{301}b  \u{301}",
            "x\u{a0}y z\u{3000}w",
            "emoji 👍🏽 and 👨‍👩‍👧 family",
        ] {
            assert_eq!(uax29_words(text), crate_words(text), "{text:?}");
        }
    }

    #[test]
    fn cjk_letters_and_runs() {
        assert!(is_cjk_letter('東') && is_cjk_letter('タ') && is_cjk_letter('ー'));
        assert!(is_cjk_letter('は') && is_cjk_letter('한') && is_cjk_letter('々'));
        assert!(!is_cjk_letter('a') && !is_cjk_letter('、') && !is_cjk_letter('・'));
        let units = |text: &str| {
            let mut out = Vec::new();
            let mut run = String::new();
            for_each_unit(text, &mut run, &mut |u| {
                out.push(match u {
                    Unit::Word(w) => format!("w:{w}"),
                    Unit::Cjk(r) => format!("c:{r}"),
                })
            });
            out
        };
        assert_eq!(units("東京タワー"), ["c:東京タワー"]);
        assert_eq!(units("東京 タワー"), ["c:東京", "c:タワー"]);
        assert_eq!(units("東京、タワー"), ["c:東京", "c:タワー"]);
        assert_eq!(units("abc東京def"), ["w:abc", "c:東京", "w:def"]);
        assert_eq!(units("한국어abc"), ["c:한국어", "w:abc"]);
        assert_eq!(units("don't 3.14"), ["w:don't", "w:3.14"]);
    }

    #[test]
    fn bigrams() {
        let grams = |run: &str, b: bool| {
            let mut out = Vec::new();
            cjk_terms(run, b, &mut |t| out.push(t.to_string()));
            out
        };
        assert_eq!(grams("東", true), ["東"]);
        assert_eq!(grams("東京", true), ["東京"]);
        assert_eq!(grams("東京都庁", true), ["東京", "京都", "都庁"]);
        assert_eq!(grams("東京都庁", false), ["東京都庁"]);
    }

    #[test]
    fn folding() {
        let fold = |w: &str| {
            let mut out = String::new();
            fold_into(w, &mut out);
            out
        };
        assert_eq!(fold("café"), "cafe");
        assert_eq!(fold("straße"), "strasse");
        assert_eq!(fold("müller"), "muller");
        assert_eq!(fold("łódź"), "lodz");
        assert_eq!(fold("þórður"), "thordur");
        assert_eq!(fold("ærøskøbing"), "aeroskobing");
        assert_eq!(fold("άλφα"), "αλφα");
        assert_eq!(fold("йогурт"), "иогурт");
        assert_eq!(fold("plain"), "plain");
    }
}
