//! What every request handler shares: the store, the tokens, the kubelet and the fault
//! knobs. Holds no logic of its own.

use std::sync::Arc;

use crate::auth::Tokens;
use crate::faults::Faults;
use crate::kubelet::Kubelet;
use crate::store::Store;

/// The server's shared state.
pub(crate) struct App {
    pub store: Arc<Store>,
    pub tokens: Arc<Tokens>,
    /// The cluster CA (PEM), as `kube-root-ca.crt` holds it.
    pub ca_pem: String,
    pub kubelet: Arc<Kubelet>,
    pub faults: Arc<Faults>,
}

pub(crate) type Shared = Arc<App>;
