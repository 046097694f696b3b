//! Lower-case hex, written without the formatting machinery: request IDs
//! and ETags are made on every request, key digests when keys are issued.

/// Appends `bytes` to `out` as lower-case hex, two digits a byte.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_what_format_writes() {
        let bytes: Vec<u8> = (0..=u8::MAX).collect();
        let mut hex = String::new();
        push_hex(&mut hex, &bytes);
        let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, formatted);
    }
}
