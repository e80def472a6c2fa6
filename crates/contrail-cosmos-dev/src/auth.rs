//! Account-key authorization, as the service checks it: with a key configured, every request must
//! carry a master-key signature made with it (`Authorization: type=master&ver=1.0&sig=…`, the
//! HMAC-SHA256 of verb, resource type, resource link and date); otherwise it is answered `401`.
//! `POST /_dev/key` replaces the key, as regenerating an account key in Azure does — so tests can
//! show what a stage does when its credentials stop working.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

/// The HMAC-SHA256 of `message` under `key` (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| -> [u8; BLOCK] { block.map(|k| k ^ byte) };
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// The resource type and link the service signs for a request path: `/dbs/d/colls/c/docs/x` →
/// (`docs`, `dbs/d/colls/c/docs/x`); a feed such as `/dbs/d/colls/c/docs` → (`docs`,
/// `dbs/d/colls/c`); the account (`/`) → (`""`, `""`).
pub fn resource_of(path: &str) -> (String, String) {
    // (Ids are compared as they appear in the path: contrail's ids need no escaping.)
    let segments: Vec<String> = path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .map(str::to_owned)
        .collect();
    match segments.len() {
        0 => (String::new(), String::new()),
        count if count % 2 == 1 => (segments[count - 1].clone(), segments[..count - 1].join("/")),
        count => (segments[count - 2].clone(), segments.join("/")),
    }
}

/// Why a request is not authorized, or `Ok` when it carries a valid signature made with `key`.
pub fn check(key: &[u8], method: &str, path: &str, headers: &http::HeaderMap) -> Result<(), String> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let authorization = header("authorization").ok_or("no Authorization header")?;
    // The header is form-URL-encoded as a whole (`type%3Dmaster%26ver%3D1.0%26sig%3D…`).
    let decoded = percent_decode(authorization)?;
    let field = |name: &str| {
        decoded
            .split('&')
            .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
    };
    if field("type").as_deref() != Some("master") {
        return Err("the Authorization header is not a master-key signature".to_owned());
    }
    let signature = field("sig").ok_or("the Authorization header has no sig")?;
    let signature = STANDARD
        .decode(signature.replace(' ', "+"))
        .map_err(|_| "the signature is not base64".to_owned())?;
    let date = header("x-ms-date")
        .or_else(|| header("date"))
        .ok_or("no x-ms-date header")?;
    let (resource_type, resource_link) = resource_of(path);
    let payload = format!(
        "{}\n{}\n{}\n{}\n\n",
        method.to_lowercase(),
        resource_type.to_lowercase(),
        resource_link,
        date.to_lowercase()
    );
    let expected = hmac_sha256(key, payload.as_bytes());
    if bool::from(expected.as_slice().ct_eq(&signature)) {
        Ok(())
    } else {
        Err("the request is not signed with the account key (a regenerated or wrong key)".to_owned())
    }
}

/// `%XX` escapes and `+` (a space) decoded.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' => {
                let hex = text
                    .get(index + 1..index + 3)
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .ok_or("a bad %-escape in the Authorization header")?;
                out.push(hex);
                index += 3;
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "the Authorization header is not UTF-8".to_owned())
}

/// Decodes an account key (base64, as the portal shows it).
pub fn decode_key(key: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(key.trim())
        .map_err(|error| format!("the account key is not base64: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test case 2.
    #[test]
    fn hmac_matches_the_rfc_vectors() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Keys longer than a block are hashed first (RFC 4231, test case 6).
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        let hex: String = mac.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(
            hex,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn resources_follow_the_service_rules() {
        assert_eq!(resource_of("/"), (String::new(), String::new()));
        assert_eq!(resource_of("/dbs"), ("dbs".to_owned(), String::new()));
        assert_eq!(
            resource_of("/dbs/contrail"),
            ("dbs".to_owned(), "dbs/contrail".to_owned())
        );
        assert_eq!(
            resource_of("/dbs/contrail/colls/flights/docs"),
            ("docs".to_owned(), "dbs/contrail/colls/flights".to_owned())
        );
        assert_eq!(
            resource_of("/dbs/contrail/colls/flights/docs/UA1-2013-01-01-EWR"),
            (
                "docs".to_owned(),
                "dbs/contrail/colls/flights/docs/UA1-2013-01-01-EWR".to_owned()
            )
        );
    }

    #[test]
    fn a_signature_with_another_key_is_refused() {
        let key = b"the-account-key";
        let date = "Tue, 01 Dec 2026 05:00:00 GMT";
        let payload = format!("get\ndocs\ndbs/d/colls/c/docs/x\n{}\n\n", date.to_lowercase());
        let sign = |key: &[u8]| {
            let signature = STANDARD.encode(hmac_sha256(key, payload.as_bytes()));
            let value: String = url::form_urlencoded::byte_serialize(
                format!("type=master&ver=1.0&sig={signature}").as_bytes(),
            )
            .collect();
            let mut headers = http::HeaderMap::new();
            headers.insert("authorization", value.parse().expect("header"));
            headers.insert("x-ms-date", date.parse().expect("header"));
            headers
        };
        assert_eq!(check(key, "GET", "/dbs/d/colls/c/docs/x", &sign(key)), Ok(()));
        let refused = check(key, "GET", "/dbs/d/colls/c/docs/x", &sign(b"old-key")).expect_err("wrong key");
        assert!(refused.contains("not signed with the account key"), "{refused}");
        assert!(
            check(key, "GET", "/dbs/d/colls/c/docs/y", &sign(key)).is_err(),
            "another resource"
        );
        assert!(check(key, "GET", "/", &http::HeaderMap::new()).is_err());
    }
}
