//! The objects a node's pods reference, read as the kubelet reads them: a ConfigMap or Secret by name (the Node
//! authorizer lets a node read only those its own pods name), a service account token bound to a pod
//! (TokenRequest, `serviceaccounts/<name>/token`), and the Services containers' environments name.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

use crate::client::Clients;

/// Reads ConfigMaps and Secrets and asks for tokens, within the main client's rate limit.
#[derive(Clone)]
pub struct ObjectReader {
    clients: Clients,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader").finish_non_exhaustive()
    }
}

/// A token the apiserver issued: the token and when it expires.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The token.
    pub token: String,
    /// When it expires.
    pub expires: jiff::Timestamp,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken").field("expires", &self.expires).finish_non_exhaustive()
    }
}

impl ObjectReader {
    /// A reader on `clients`.
    pub fn new(clients: Clients) -> ObjectReader {
        ObjectReader { clients }
    }

    /// The ConfigMap `name` in `namespace`; `None` when there is none.
    pub async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
        self.clients.limiter.acquire().await;
        Api::<ConfigMap>::namespaced(self.clients.main(), namespace).get_opt(name).await
    }

    /// The Secret `name` in `namespace`; `None` when there is none.
    pub async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, kube::Error> {
        self.clients.limiter.acquire().await;
        Api::<Secret>::namespaced(self.clients.main(), namespace).get_opt(name).await
    }

    /// The Services of `namespace`.
    pub async fn services(&self, namespace: &str) -> Result<Vec<Service>, kube::Error> {
        self.clients.limiter.acquire().await;
        let list = Api::<Service>::namespaced(self.clients.main(), namespace).list(&Default::default()).await?;
        Ok(list.items)
    }

    /// A token of service account `account` in `namespace`, for `audience` (the apiserver's own when `None`),
    /// living `seconds`, bound to the pod `pod_name` of UID `pod_uid`, as the kubelet's token manager asks.
    pub async fn token(
        &self,
        namespace: &str,
        account: &str,
        audience: Option<&str>,
        seconds: i64,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<IssuedToken, kube::Error> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_owned()]).unwrap_or_default(),
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name.into()),
                    uid: Some(pod_uid.into()),
                }),
            },
            ..TokenRequest::default()
        };
        self.clients.limiter.acquire().await;
        let api = Api::<ServiceAccount>::namespaced(self.clients.main(), namespace);
        let issued = api.create_token_request(account, &PostParams::default(), &request).await?;
        match issued.status {
            Some(status) => Ok(IssuedToken { token: status.token, expires: status.expiration_timestamp.0 }),
            None => Err(kube::Error::Service("the TokenRequest came back without a status".into())),
        }
    }
}
