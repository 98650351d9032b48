//! EC2 Instance Connect, as fleeting-plugin-aws uses it when `connector_config`
//! `use_static_credentials` is false: before each connection the plugin pushes a public key
//! for the login user to the instance (`SendSSHPublicKey`), which accepts it for 60 seconds.
//! The key is the configured one (`key_path`, an OpenSSH ed25519 key) or, without one, an
//! ed25519 key made for this connection alone.
//!
//! Owns: the key pair and the request body. Must not touch: signing or sending (`api`), which
//! instance or user (`lib.rs`).

use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{LineEnding, PrivateKey};

/// How long EC2 accepts a pushed key.
pub const KEY_LIFETIME_SECONDS: u64 = 60;

/// The JSON 1.1 target of the push.
pub const SEND_SSH_PUBLIC_KEY: &str = "AWSEC2InstanceConnectService.SendSSHPublicKey";

/// A key pair for one connection: the private key the host connects with (OpenSSH PEM) and
/// the public key pushed to the instance (`ssh-ed25519 AAAA…`).
#[derive(Debug)]
pub struct Pushable {
    /// OpenSSH private key.
    pub private_pem: Vec<u8>,
    /// OpenSSH public key line.
    pub public: String,
}

/// The configured key's pair (`configured`: the PEM `key_path` points at), or a new ed25519
/// key when none is configured.
pub fn key_pair(configured: Option<&[u8]>) -> Result<Pushable, String> {
    let private = match configured {
        Some(pem) => {
            let text = std::str::from_utf8(pem).map_err(|_| "connector_config key is not text".to_string())?;
            let key = PrivateKey::from_openssh(text).map_err(|e| {
                format!(
                    "EC2 Instance Connect needs the configured key's public half, and the key cannot be read \
                     ({e}): use an unencrypted OpenSSH ed25519 key, or set use_static_credentials = true"
                )
            })?;
            if !matches!(key.key_data(), KeypairData::Ed25519(_)) {
                return Err(format!(
                    "EC2 Instance Connect here takes ed25519 keys; the configured key is {}: use an ed25519 key, \
                     no key (one is made per connection), or use_static_credentials = true",
                    key.algorithm()
                ));
            }
            key
        }
        None => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| format!("no randomness for an ephemeral key: {e}"))?;
            PrivateKey::new(KeypairData::Ed25519(Ed25519Keypair::from_seed(&seed)), "runway-ephemeral")
                .map_err(|e| format!("making an ephemeral key: {e}"))?
        }
    };
    let public = private.public_key().to_openssh().map_err(|e| format!("encoding the public key: {e}"))?;
    let pem = private.to_openssh(LineEnding::LF).map_err(|e| format!("encoding the ephemeral key: {e}"))?;
    Ok(Pushable { private_pem: pem.as_bytes().to_vec(), public })
}

/// `SendSSHPublicKey`'s body.
pub fn request(instance: &str, user: &str, public: &str) -> String {
    serde_json::json!({ "InstanceId": instance, "InstanceOSUser": user, "SSHPublicKey": public }).to_string()
}
