//! Base64 (RFC 4648), encoding only: standard with padding (a Secret's data in JSON) or URL-safe without (JWTs).

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `bytes` in base64: URL-safe and unpadded with `url`, else standard and padded.
pub fn encode(bytes: &[u8], url: bool) -> String {
    let alphabet = if url { URL } else { STANDARD };
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let index = usize::try_from((n >> (18 - 6 * i)) & 63).unwrap_or(0);
                out.push(char::from(alphabet[index]));
            } else if !url {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_alphabets_and_padding() {
        assert_eq!(encode(b"", false), "");
        assert_eq!(encode(b"f", false), "Zg==");
        assert_eq!(encode(b"fo", false), "Zm8=");
        assert_eq!(encode(b"foo", false), "Zm9v");
        assert_eq!(encode(b"f", true), "Zg");
        assert_eq!(encode(&[0xfb, 0xff], true), "-_8");
        assert_eq!(encode(&[0xfb, 0xff], false), "+/8=");
    }
}
