//! Hex: written lower-case without the formatting machinery (request IDs
//! and ETags are made on every request, key digests when keys are issued),
//! and read in either case (key digests, a path's percent escapes).

/// Appends `bytes` to `out` as lower-case hex, two digits a byte.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// Two hex digits, either case, as the byte they write; `None` for
/// anything else (a sign or a space included).
pub fn byte_of(high: u8, low: u8) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    Some(digit(high)? << 4 | digit(low)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_digits_of_either_case_read_as_a_byte() {
        assert_eq!(byte_of(b'0', b'0'), Some(0));
        assert_eq!(byte_of(b'f', b'F'), Some(255));
        assert_eq!(byte_of(b'7', b'e'), Some(0x7e));
        for (high, low) in [(b'g', b'0'), (b'0', b' '), (b'+', b'1'), (b'-', b'1')] {
            assert_eq!(byte_of(high, low), None);
        }
    }

    #[test]
    fn every_byte_is_what_format_writes() {
        let bytes: Vec<u8> = (0..=u8::MAX).collect();
        let mut hex = String::new();
        push_hex(&mut hex, &bytes);
        let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, formatted);
    }
}
