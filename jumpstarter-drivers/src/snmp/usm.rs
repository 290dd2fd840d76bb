//! The User-based Security Model (RFC 3414, RFC 3826): password-to-key, key localization,
//! HMAC-MD5-96 / HMAC-SHA-96 authentication, CBC-DES and CFB128-AES-128 privacy.

use aes::Aes128;
use des::Des;
use des::cipher::{BlockDecrypt, BlockEncrypt, KeyInit, generic_array::GenericArray};
use md5::{Digest, Md5};
use sha1::Sha1;

use super::error::SnmpError;

/// Length of the truncated HMAC in `msgAuthenticationParameters`.
pub const AUTH_PARAMS_LEN: usize = 12;

/// An authentication protocol (upstream's `auth_protocol` other than `NONE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthProto {
    /// HMAC-MD5-96.
    Md5,
    /// HMAC-SHA-96.
    Sha,
}

/// A privacy protocol (upstream's `priv_protocol` other than `NONE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivProto {
    /// CBC-DES.
    Des,
    /// CFB128-AES-128.
    Aes,
}

fn digest(proto: AuthProto, parts: &[&[u8]]) -> Vec<u8> {
    match proto {
        AuthProto::Md5 => {
            let mut h = Md5::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().to_vec()
        }
        AuthProto::Sha => {
            let mut h = Sha1::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().to_vec()
        }
    }
}

/// RFC 3414 A.2: the user's key from a password (hash of 1 MiB of the repeated password).
pub fn password_to_key(proto: AuthProto, password: &[u8]) -> Vec<u8> {
    const TOTAL: usize = 1024 * 1024;
    if password.is_empty() {
        return digest(proto, &[]);
    }
    let mut block = [0u8; 64];
    let mut index = 0usize;
    let mut fill = |block: &mut [u8; 64]| {
        for b in block.iter_mut() {
            *b = password[index % password.len()];
            index += 1;
        }
    };
    match proto {
        AuthProto::Md5 => {
            let mut h = Md5::new();
            for _ in 0..TOTAL / 64 {
                fill(&mut block);
                h.update(block);
            }
            h.finalize().to_vec()
        }
        AuthProto::Sha => {
            let mut h = Sha1::new();
            for _ in 0..TOTAL / 64 {
                fill(&mut block);
                h.update(block);
            }
            h.finalize().to_vec()
        }
    }
}

/// RFC 3414 A.2: the key localized to an authoritative engine.
pub fn localize(proto: AuthProto, key: &[u8], engine_id: &[u8]) -> Vec<u8> {
    digest(proto, &[key, engine_id, key])
}

/// HMAC (RFC 2104) with the protocol's hash, truncated to 96 bits.
pub fn hmac96(proto: AuthProto, key: &[u8], data: &[u8]) -> [u8; AUTH_PARAMS_LEN] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        let d = digest(proto, &[key]);
        k[..d.len()].copy_from_slice(&d);
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = digest(proto, &[&ipad, data]);
    let outer = digest(proto, &[&opad, &inner]);
    let mut mac = [0u8; AUTH_PARAMS_LEN];
    mac.copy_from_slice(&outer[..AUTH_PARAMS_LEN]);
    mac
}

/// Encrypts a scoped PDU. `salt` is the 64-bit value sent as `msgPrivacyParameters`
/// (for DES, RFC 3414 8.1.1.1 wants the engine boots in its upper half: the caller builds it).
pub fn encrypt(
    proto: PrivProto,
    key: &[u8],
    boots: u32,
    time: u32,
    salt: [u8; 8],
    plain: &[u8],
) -> Result<Vec<u8>, SnmpError> {
    match proto {
        PrivProto::Des => {
            let (cipher, pre_iv) = des_cipher(key)?;
            let mut iv: [u8; 8] = std::array::from_fn(|i| pre_iv[i] ^ salt[i]);
            let mut out = plain.to_vec();
            // Padded to whole blocks; the receiver ignores what follows the scoped PDU.
            out.resize(plain.len().div_ceil(8) * 8, 0);
            for chunk in out.chunks_mut(8) {
                for (b, v) in chunk.iter_mut().zip(iv) {
                    *b ^= v;
                }
                cipher.encrypt_block(GenericArray::from_mut_slice(chunk));
                iv.copy_from_slice(chunk);
            }
            Ok(out)
        }
        PrivProto::Aes => Ok(aes_cfb(key, boots, time, salt, plain, true)?),
    }
}

/// Decrypts a scoped PDU sent with `msgPrivacyParameters` = `salt`.
pub fn decrypt(
    proto: PrivProto,
    key: &[u8],
    boots: u32,
    time: u32,
    salt: [u8; 8],
    data: &[u8],
) -> Result<Vec<u8>, SnmpError> {
    match proto {
        PrivProto::Des => {
            if !data.len().is_multiple_of(8) {
                return Err(SnmpError::Malformed(
                    "DES-encrypted data is not a whole number of blocks".into(),
                ));
            }
            let (cipher, pre_iv) = des_cipher(key)?;
            let mut iv: [u8; 8] = std::array::from_fn(|i| pre_iv[i] ^ salt[i]);
            let mut out = data.to_vec();
            for chunk in out.chunks_mut(8) {
                let mut c = [0u8; 8];
                c.copy_from_slice(chunk);
                cipher.decrypt_block(GenericArray::from_mut_slice(chunk));
                for (b, v) in chunk.iter_mut().zip(iv) {
                    *b ^= v;
                }
                iv = c;
            }
            Ok(out)
        }
        PrivProto::Aes => aes_cfb(key, boots, time, salt, data, false),
    }
}

fn des_cipher(key: &[u8]) -> Result<(Des, [u8; 8]), SnmpError> {
    if key.len() < 16 {
        return Err(SnmpError::Malformed(
            "DES privacy key shorter than 16 bytes".into(),
        ));
    }
    let cipher = Des::new_from_slice(&key[..8])
        .map_err(|_| SnmpError::Malformed("bad DES key length".into()))?;
    let mut pre_iv = [0u8; 8];
    pre_iv.copy_from_slice(&key[8..16]);
    Ok((cipher, pre_iv))
}

fn aes_cfb(
    key: &[u8],
    boots: u32,
    time: u32,
    salt: [u8; 8],
    data: &[u8],
    encrypting: bool,
) -> Result<Vec<u8>, SnmpError> {
    let key = key
        .get(..16)
        .ok_or_else(|| SnmpError::Malformed("AES privacy key shorter than 16 bytes".into()))?;
    let cipher = Aes128::new_from_slice(key)
        .map_err(|_| SnmpError::Malformed("bad AES key length".into()))?;
    let mut iv = [0u8; 16];
    iv[..4].copy_from_slice(&boots.to_be_bytes());
    iv[4..8].copy_from_slice(&time.to_be_bytes());
    iv[8..].copy_from_slice(&salt);
    let mut out = Vec::with_capacity(data.len());
    for chunk in data.chunks(16) {
        let mut ks = iv;
        cipher.encrypt_block(GenericArray::from_mut_slice(&mut ks));
        let start = out.len();
        out.extend(chunk.iter().zip(ks).map(|(b, k)| b ^ k));
        // The next block's input is the ciphertext of this one.
        let cipher_block = if encrypting { &out[start..] } else { chunk };
        iv[..cipher_block.len()].copy_from_slice(cipher_block);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    // RFC 3414 A.3.1 and A.3.2: password "maplesyrup", engine ID 00..02.
    const ENGINE: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    #[test]
    fn md5_key_localization_matches_rfc3414() {
        let ku = password_to_key(AuthProto::Md5, b"maplesyrup");
        assert_eq!(hex(&ku), "9faf3283884e92834ebc9847d8edd963");
        let kul = localize(AuthProto::Md5, &ku, &ENGINE);
        assert_eq!(hex(&kul), "526f5eed9fcce26f8964c2930787d82b");
    }

    #[test]
    fn sha_key_localization_matches_rfc3414() {
        let ku = password_to_key(AuthProto::Sha, b"maplesyrup");
        assert_eq!(hex(&ku), "9fb5cc0381497b3793528939ff788d5d79145211");
        let kul = localize(AuthProto::Sha, &ku, &ENGINE);
        assert_eq!(hex(&kul), "6695febc9288e36282235fc7151f128497b38f3f");
    }

    #[test]
    fn hmac_md5_matches_rfc2202() {
        // RFC 2202 test case 2, truncated to 96 bits.
        let mac = hmac96(AuthProto::Md5, b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "750c783e6ab0b503eaa86e31");
        let mac = hmac96(AuthProto::Sha, b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "effcdf6ae5eb2fa2d27416d5");
    }

    #[test]
    fn privacy_round_trips_and_changes_the_bytes() {
        let key = [7u8; 20];
        let plain: Vec<u8> = (0..37u8).collect();
        for proto in [PrivProto::Des, PrivProto::Aes] {
            let c = encrypt(proto, &key, 3, 99, [1; 8], &plain).unwrap();
            assert_ne!(&c[..plain.len()], &plain[..]);
            let p = decrypt(proto, &key, 3, 99, [1; 8], &c).unwrap();
            assert_eq!(&p[..plain.len()], &plain[..], "{proto:?}");
        }
        assert!(decrypt(PrivProto::Des, &key, 0, 0, [0; 8], &[1, 2, 3]).is_err());
    }
}
