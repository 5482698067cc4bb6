//! GPT-2's byte-level alphabet: every byte maps to one printable character, so that a
//! byte-level BPE vocabulary can be stored as text.
//!
//! Bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` map to the character with the same code; the other 68
//! bytes, in ascending order, map to U+0100, U+0101, … (so a space is `Ġ`, U+0120, and a newline
//! `Ċ`, U+010A).

/// The character byte `b` is written as.
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte that character `c` stands for, if `c` is in the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    if code < 0x100 {
        let b = code as u8;
        return is_direct(b).then_some(b);
    }
    let idx = code - 0x100;
    INDIRECT.get(idx as usize).copied()
}

/// Whether byte `b` maps to the character with the same code.
const fn is_direct(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        table[b] = if is_direct(b as u8) {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(0x100 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    table
};

/// The bytes that do not map to themselves, in ascending order: `INDIRECT[k]` is U+0100 + k.
const INDIRECT: [u8; 68] = {
    let mut table = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_direct(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_known_values() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
        assert_eq!(char_to_byte('\u{144}'), None);
    }
}
