//! The character classes the pre-tokenizers test: `\p{L}`, `\p{N}`, `\p{P}` and `\s`.
//!
//! Categories come from the Unicode general category (the `unicode-general-category` tables);
//! whitespace is Unicode's `White_Space` set, which is the set llama.cpp's tables list.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// What the pre-tokenizers need to know about one character.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// The position is inside the piece being split (outside, every flag is false).
    pub present: bool,
    /// `\p{L}`
    pub letter: bool,
    /// `\p{N}`
    pub number: bool,
    /// `\s` (Unicode `White_Space`)
    pub whitespace: bool,
}

impl Flags {
    /// The flags of `c`.
    #[inline]
    pub fn of(c: char) -> Flags {
        if c.is_ascii() {
            return Flags {
                present: true,
                letter: c.is_ascii_alphabetic(),
                number: c.is_ascii_digit(),
                whitespace: matches!(c, '\t' | '\n' | '\x0B' | '\x0C' | '\r' | ' '),
            };
        }
        Flags {
            present: true,
            letter: is_letter(c),
            number: is_number(c),
            whitespace: c.is_whitespace(),
        }
    }
}

/// `\p{L}`: general category Lu, Ll, Lt, Lm or Lo.
pub(crate) fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches!(
        get_general_category(c),
        Gc::UppercaseLetter
            | Gc::LowercaseLetter
            | Gc::TitlecaseLetter
            | Gc::ModifierLetter
            | Gc::OtherLetter
    )
}

/// `\p{N}`: general category Nd, Nl or No.
pub(crate) fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches!(
        get_general_category(c),
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber
    )
}

/// `\p{P}`: general category Pc, Pd, Ps, Pe, Pi, Pf or Po.
pub(crate) fn is_punctuation(c: char) -> bool {
    matches!(
        get_general_category(c),
        Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::OpenPunctuation
            | Gc::ClosePunctuation
            | Gc::InitialPunctuation
            | Gc::FinalPunctuation
            | Gc::OtherPunctuation
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(Flags::of('a').letter && Flags::of('é').letter && Flags::of('你').letter);
        assert!(Flags::of('7').number && Flags::of('٣').number && Flags::of('½').number);
        assert!(Flags::of('\u{3000}').whitespace && Flags::of('\u{a0}').whitespace);
        assert!(!Flags::of('\u{200b}').whitespace);
        assert!(is_punctuation('，') && is_punctuation('!') && !is_punctuation('$'));
        let emoji = Flags::of('🦀');
        assert!(emoji.present && !emoji.letter && !emoji.number && !emoji.whitespace);
    }
}
