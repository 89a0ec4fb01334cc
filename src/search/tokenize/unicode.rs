//! The pieces of the Unicode tokenizer: words (UAX #29, with a byte loop for ASCII), CJK runs,
//! folding.
//!
//! Words: `unicode-segmentation`'s UAX #29 segments, each cut at the punctuation UAX #29 lets
//! stand inside a word (`'` `’` `.` `:` `,` `;` `_` `·` and the like): a word is a maximal run,
//! within a segment, of letters, digits, marks (General_Category M) and format characters
//! (Cf: ZWJ, ZWNJ), holding a letter or digit. So `don't` is `don` `t`, `3.14` is `3` `14`,
//! `mod_ssl` is `mod` `ssl`; UAX #29 still decides where marks and joiners belong (Devanagari
//! viramas, Persian ZWNJ stay in their word), keeps each Han character and hiragana apart
//! (made bigrams after) and never joins letters of two scripts it keeps apart. On ASCII text
//! the words are the maximal runs of `[A-Za-z0-9]`: UAX #29 joins every two adjacent ASCII
//! letters or digits (WB5, WB8 to WB10), and every other ASCII character is a cut.
//!
//! Two shortcuts give the same words, checked against Unicode's `WordBreakTest.txt` and against
//! the plain algorithm on real text (tests/tokenizer_real_data.rs):
//! - text is cut at every ASCII whitespace byte followed by an ASCII byte: UAX #29 always has a
//!   boundary there (no rule joins a space, tab or newline to a following ASCII character), and
//!   NFKC cannot compose across it (ASCII characters are starters that compose with nothing
//!   before them), so each piece is normalized and segmented alone;
//! - an all-ASCII piece takes [`ascii_words`], a byte loop, and skips NFKC (ASCII is NFKC).
//!
//! Scripts: a CJK letter is an alphanumeric character whose Script_Extensions (UAX #24, from
//! `unicode-script`) include Han, Hiragana, Katakana or Hangul. Script_Extensions rather than
//! Script, so that `ー` (U+30FC, Script=Common) and `々` count with the kana and kanji they
//! extend.

use unicode_normalization::char::decompose_compatible;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};
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

/// The words of an all-ASCII `text`: its maximal runs of ASCII letters and digits.
pub(super) fn ascii_words<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    debug_assert!(text.is_ascii());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_alphanumeric() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        f(&text[start..i]);
    }
}

/// Whether `c`, not a letter or digit, stays inside a word: a mark or a format character.
fn joins_word(c: char) -> bool {
    matches!(c.general_category_group(), GeneralCategoryGroup::Mark)
        || c.general_category() == GeneralCategory::Format
}

/// The words of `text` as the tokenizer finds them (pieces; ASCII by the byte loop, the rest by
/// `unicode-segmentation`, cut at punctuation), before normalization, lowercasing and CJK runs.
pub fn uax29_words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut run = String::new();
    for_each_piece(text, |piece| {
        if piece.is_ascii() {
            ascii_words(piece, |w| out.push(w));
        } else {
            // Words are slices of `piece`: found again by their offset.
            let mut spans = Vec::new();
            for_each_unit(piece, false, &mut run, &mut |u| {
                if let Unit::Word(w) = u {
                    spans.push((w.as_ptr() as usize - piece.as_ptr() as usize, w.len()));
                }
            });
            out.extend(spans.into_iter().map(|(at, len)| &piece[at..at + len]));
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
    [
        Script::Han,
        Script::Hiragana,
        Script::Katakana,
        Script::Hangul,
    ]
    .into_iter()
    .any(|s| scx.contains_script(s))
}

/// A word or a CJK run, before lowercasing.
pub(super) enum Unit<'a> {
    /// A word: letters, digits, marks and format characters.
    Word(&'a str),
    /// A run of CJK letters, adjacent in the text (marks after them left out).
    Cjk(&'a str),
}

/// Calls `f` with the words and (with `cjk`) the CJK runs of `text`, in order.
///
/// Within a segment holding a letter or digit, a word runs over letters, digits, marks and
/// format characters; any other character (punctuation) ends it. With `cjk`, CJK letters are
/// not word characters but go to the current run, with the marks after them left out. A run
/// goes on across segments (UAX #29 makes each Han character and each hiragana a segment) until
/// a word, a punctuation character or a segment with no letter or digit comes between.
pub(super) fn for_each_unit(text: &str, cjk: bool, run: &mut String, f: &mut dyn FnMut(Unit<'_>)) {
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
        let end_word = |word: &mut Option<usize>, i: usize, f: &mut dyn FnMut(Unit<'_>)| {
            if let Some(s) = word.take() {
                let w = &seg[s..i];
                if w.chars().any(char::is_alphanumeric) {
                    f(Unit::Word(w));
                }
            }
        };
        for (i, c) in seg.char_indices() {
            if cjk && is_cjk_letter(c) {
                end_word(&mut word, i, f);
                run.push(c);
                after_cjk = true;
            } else if c.is_alphanumeric() || joins_word(c) {
                if word.is_none() && (!after_cjk || c.is_alphanumeric()) {
                    flush(run, f);
                    word = Some(i);
                    after_cjk = false;
                }
            } else {
                end_word(&mut word, i, f);
                flush(run, f);
                after_cjk = false;
            }
        }
        end_word(&mut word, seg.len(), f);
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

    /// The crate's UAX #29 words cut at punctuation, written out plainly.
    fn crate_words(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for w in text.unicode_words() {
            out.extend(
                w.split(|c: char| !(c.is_alphanumeric() || joins_word(c)))
                    .filter(|p| p.chars().any(char::is_alphanumeric)),
            );
        }
        out
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
        // Every four-character string over a Word_Break-class-covering alphabet.
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
    fn pieces_and_units_keep_the_crates_words() {
        for text in [
            "café au lait, naïve  résumé",
            "東京 タワー\tは 高い。",
            "a \u{301}b  \u{301}",
            "x\u{a0}y z\u{3000}w",
            "emoji 👍🏽 and 👨‍👩‍👧 family",
            "हिन्दी می\u{200c}خواهم col·lecció l'été",
            "Москва-Сити 3,5 км",
        ] {
            assert_eq!(uax29_words(text), crate_words(text), "{text:?}");
        }
        // Marks and joiners stay in their word; punctuation cuts.
        assert_eq!(uax29_words("हिन्दी"), ["हिन्दी"]);
        assert_eq!(uax29_words("می\u{200c}خواهم"), ["می\u{200c}خواهم"]);
        assert_eq!(
            uax29_words("col·lecció l'été"),
            ["col", "lecció", "l", "été"]
        );
    }

    #[test]
    fn cjk_letters_and_runs() {
        assert!(is_cjk_letter('東') && is_cjk_letter('タ') && is_cjk_letter('ー'));
        assert!(is_cjk_letter('は') && is_cjk_letter('한') && is_cjk_letter('々'));
        assert!(!is_cjk_letter('a') && !is_cjk_letter('、') && !is_cjk_letter('・'));
        let units = |text: &str| {
            let mut out = Vec::new();
            let mut run = String::new();
            for_each_unit(text, true, &mut run, &mut |u| {
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
        assert_eq!(units("don't 3.14"), ["w:don", "w:t", "w:3", "w:14"]);
        assert_eq!(units("カ_カ"), ["c:カ", "c:カ"]);
        assert_eq!(units("が\u{3099}き"), ["c:がき"]);
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
