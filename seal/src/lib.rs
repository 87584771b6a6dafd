//! Sealed states (opt-in): each part of a state and each history row is sealed with AES-256-GCM
//! before it leaves the runner (RustCrypto's `aes-gcm`; no cryptography of our own).
//!
//! Not yet wired into the guest (issue 51 is in progress): the component does not depend on it,
//! so its size is as it was. Wired, sealing and opening add about 29 KB to the component.
//!
//! A sealed value is text, as the columns hold JSON:
//! `sealed:1:<key id>:<base64 of nonce ‖ ciphertext ‖ tag>`.
//! - The key id is the first 4 bytes of HMAC-SHA256 of a label of its own under the key, in hex:
//!   it names the key and tells nothing of it (not AES of a zero block, a key check value, which
//!   in GCM is the hash key H itself).
//! - The nonce is 96 bits of the host's `wasi:random`, fresh for every value.
//! - The associated data binds the value to its place: the table, the state id, the part and
//!   the version (the row's time). A sealed value moved to another id, table or part does not
//!   open, nor an older one put back as a newer version.
//!
//! A value without the prefix is plain (written before a key was set) and reads as it is, so a
//! fleet turns sealing on without moving its state.

use std::borrow::Cow;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// What the key id is the HMAC of.
const KEY_ID_LABEL: &[u8] = b"meltano-state/1 key id";

/// What every sealed value starts with: the envelope's version is the `1`.
pub const PREFIX: &str = "sealed:1:";

/// Which part of a state a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Partial,
    Completed,
}

/// Where a value is stored: what its associated data binds it to.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The state table's qualified name, for its history's rows too (its view copies them
    /// into the state table as they are).
    pub table: &'a str,
    pub state_id: &'a str,
    pub part: Part,
    /// The row's version (its time in unix ms).
    pub version_ms: u64,
}

impl Place<'_> {
    fn associated_data(&self) -> Vec<u8> {
        let part = match self.part {
            Part::Partial => "partial",
            Part::Completed => "completed",
        };
        // Each text goes after its length, so that no two places give the same bytes.
        format!(
            "meltano-state/1 {}:{} {}:{} {part} {}",
            self.table.len(),
            self.table,
            self.state_id.len(),
            self.state_id,
            self.version_ms
        )
        .into_bytes()
    }
}

/// One key, ready to seal and open.
pub struct Key {
    id: String,
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id only: the key never reaches a log, an error or a panic.
        write!(f, "Key({})", self.id)
    }
}

impl Key {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, String> {
        if bytes.len() != 32 {
            return Err(format!(
                "a key is 32 bytes (256 bits), this one is {}",
                bytes.len()
            ));
        }
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(bytes)
            .map_err(|_| "a key is 32 bytes".to_string())?;
        mac.update(KEY_ID_LABEL);
        let id = mac.finalize().into_bytes()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let cipher =
            Aes256Gcm::new_from_slice(bytes).map_err(|_| "a key is 32 bytes".to_string())?;
        Ok(Key { id, cipher })
    }

    /// A key from its base64 text (the settings' form).
    pub fn from_base64(text: &str) -> Result<Key, String> {
        let bytes = BASE64
            .decode(text.trim())
            .map_err(|_| "a key is 32 bytes in base64 (`openssl rand -base64 32`)".to_string())?;
        Key::from_bytes(&bytes)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `plaintext` sealed for `place` with `nonce`, which must be fresh for every value (96
    /// random bits: the guest's `wasi:random`); `None` past what AES-GCM seals in one value.
    pub fn seal(&self, place: Place, plaintext: &str, nonce: [u8; 12]) -> Option<String> {
        let aad = place.associated_data();
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: &aad,
                },
            )
            .ok()?;
        let mut body = Vec::with_capacity(12 + sealed.len());
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&sealed);
        Some(format!("{PREFIX}{}:{}", self.id, BASE64.encode(body)))
    }

    fn open(&self, place: Place, body: &[u8]) -> Option<String> {
        let (nonce, sealed) = body.split_at_checked(12)?;
        let aad = place.associated_data();
        let opened = self
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .ok()?;
        String::from_utf8(opened).ok()
    }
}

/// Why a stored value does not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Sealed with a key that is not configured (`None`: no key is).
    UnknownKey { sealed_with: String },
    /// The key is right, and the value does not open under it at this place: it was changed,
    /// or moved from another id, table or part.
    Tampered { key: String },
    /// It starts as a sealed value and is not one.
    Malformed,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::UnknownKey { sealed_with } => write!(
                f,
                "it was sealed with key {sealed_with}, which is neither encryption_key nor \
                 encryption_fallback_key"
            ),
            Refused::Tampered { key } => write!(
                f,
                "it does not open with key {key}: it was changed, or moved from another state \
                 id or table"
            ),
            Refused::Malformed => write!(f, "it starts as a sealed value and is not one"),
        }
    }
}

/// The keys a store seals with (the first) and opens with (either).
#[derive(Debug, Default)]
pub struct Keys {
    pub primary: Option<Key>,
    pub fallback: Option<Key>,
}

impl Keys {
    /// Whether writes seal.
    pub fn seals(&self) -> bool {
        self.primary.is_some()
    }

    /// `plaintext`, sealed for `place` when a key is set; `None` when it cannot be.
    pub fn seal<'v>(
        &self,
        place: Place,
        plaintext: &'v str,
        nonce: [u8; 12],
    ) -> Option<Cow<'v, str>> {
        match &self.primary {
            Some(key) => key.seal(place, plaintext, nonce).map(Cow::Owned),
            None => Some(Cow::Borrowed(plaintext)),
        }
    }

    /// A stored value as its plaintext: a plain one as it is, a sealed one opened with the key
    /// it names.
    pub fn open<'v>(&self, place: Place, stored: &'v str) -> Result<Cow<'v, str>, Refused> {
        let Some(sealed) = stored.strip_prefix(PREFIX) else {
            return Ok(Cow::Borrowed(stored));
        };
        let (id, body) = sealed.split_once(':').ok_or(Refused::Malformed)?;
        let body = BASE64.decode(body).map_err(|_| Refused::Malformed)?;
        let key = [&self.primary, &self.fallback]
            .into_iter()
            .flatten()
            .find(|key| key.id == id)
            .ok_or_else(|| Refused::UnknownKey {
                sealed_with: id.to_string(),
            })?;
        key.open(place, &body)
            .map(Cow::Owned)
            .ok_or_else(|| Refused::Tampered {
                key: id.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const B: &str = "HxwdGhsYGRYXFBUSExAREA4PDA0KCwgJBgcEBQIDAAE=";

    fn place(id: &str) -> Place<'_> {
        Place {
            table: "meltano.state",
            state_id: id,
            part: Part::Completed,
            version_ms: 1_796_000_000_000,
        }
    }

    fn keys(primary: &str, fallback: Option<&str>) -> Keys {
        Keys {
            primary: Some(Key::from_base64(primary).unwrap()),
            fallback: fallback.map(|k| Key::from_base64(k).unwrap()),
        }
    }

    const BOOKMARK: &str = r#"{"singer_state":{"bookmarks":{"orders":{"id":"acme-42"}}}}"#;

    #[test]
    fn a_sealed_value_opens_at_its_place_and_shows_nothing_of_its_text() {
        let keys = keys(A, None);
        let sealed = keys.seal(place("dev:a"), BOOKMARK, [7; 12]).unwrap();
        assert!(sealed.starts_with(PREFIX), "{sealed}");
        assert!(
            !sealed.contains("acme") && !sealed.contains("orders"),
            "{sealed}"
        );
        assert_eq!(keys.open(place("dev:a"), &sealed).unwrap(), BOOKMARK);
        // a fresh nonce, another text
        assert_ne!(
            keys.seal(place("dev:a"), BOOKMARK, [8; 12]).unwrap(),
            sealed
        );
    }

    #[test]
    fn plain_values_read_as_they_are() {
        assert_eq!(keys(A, None).open(place("x"), BOOKMARK).unwrap(), BOOKMARK);
        assert_eq!(
            Keys::default().open(place("x"), BOOKMARK).unwrap(),
            BOOKMARK
        );
        assert_eq!(
            Keys::default().seal(place("x"), BOOKMARK, [0; 12]).unwrap(),
            BOOKMARK
        );
    }

    #[test]
    fn a_flipped_byte_another_place_and_a_wrong_key_are_refused() {
        let keys_a = keys(A, None);
        let sealed = keys_a
            .seal(place("dev:a"), BOOKMARK, [1; 12])
            .unwrap()
            .into_owned();
        let id = Key::from_base64(A).unwrap().id().to_string();
        // each byte of the body flipped in turn
        let (head, body) = sealed.rsplit_once(':').unwrap();
        let mut raw = BASE64.decode(body).unwrap();
        for at in 0..raw.len() {
            raw[at] ^= 1;
            let flipped = format!("{head}:{}", BASE64.encode(&raw));
            assert_eq!(
                keys_a.open(place("dev:a"), &flipped),
                Err(Refused::Tampered { key: id.clone() }),
                "byte {at}"
            );
            raw[at] ^= 1;
        }
        // another id, another table, another part
        let other_table = Place {
            table: "meltano.other",
            ..place("dev:a")
        };
        let other_part = Place {
            part: Part::Partial,
            ..place("dev:a")
        };
        let other_version = Place {
            version_ms: 1_796_000_000_001,
            ..place("dev:a")
        };
        for elsewhere in [place("dev:b"), other_table, other_part, other_version] {
            assert!(matches!(
                keys_a.open(elsewhere, &sealed),
                Err(Refused::Tampered { .. })
            ));
        }
        // a key that is not the one it names
        let keys_b = keys(B, None);
        assert_eq!(
            keys_b.open(place("dev:a"), &sealed),
            Err(Refused::UnknownKey { sealed_with: id })
        );
        assert_eq!(
            Keys::default().open(place("dev:a"), "sealed:1:zz"),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn the_fallback_key_opens_what_the_old_key_sealed() {
        let old = keys(A, None);
        let sealed = old
            .seal(place("dev:a"), BOOKMARK, [3; 12])
            .unwrap()
            .into_owned();
        let rotated = keys(B, Some(A));
        assert_eq!(rotated.open(place("dev:a"), &sealed).unwrap(), BOOKMARK);
        let resealed = rotated.seal(place("dev:a"), BOOKMARK, [4; 12]).unwrap();
        assert!(resealed.contains(Key::from_base64(B).unwrap().id()));
    }

    #[test]
    fn a_key_is_32_bytes_and_never_shows() {
        assert!(
            Key::from_base64("c2hvcnQ=")
                .unwrap_err()
                .contains("32 bytes")
        );
        assert!(
            Key::from_base64("not base64!")
                .unwrap_err()
                .contains("base64")
        );
        let key = Key::from_base64(A).unwrap();
        assert_eq!(key.id().len(), 8);
        assert_eq!(format!("{key:?}"), format!("Key({})", key.id()));
        let refused = Refused::Tampered {
            key: key.id().to_string(),
        };
        assert!(!refused.to_string().contains(A));
    }
}
