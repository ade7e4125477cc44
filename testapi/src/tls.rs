//! TLS as a cluster's apiserver serves it: a CA of its own, a serving certificate for `127.0.0.1` and `localhost`,
//! and client certificates it issues (`CN=system:node:<name>, O=system:nodes` for a node, as a kubelet's
//! bootstrap or rotation gets, `CN=admin, O=system:masters` for an admin).
//!
//! The handshake asks for a client certificate without requiring one, and the x509 authenticator decides after it,
//! as the apiserver's does: a certificate this CA issued and still valid names the user; one expired, not yet valid
//! or not issued here is refused with 401 unless a token authenticates the request. Only this server issues
//! certificates, so one it issued is one that chains to its CA.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::DistinguishedName as HintName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// A client certificate this server issued, and what it proves.
struct Issued {
    /// `Some(node)` for a node's certificate, `None` for an admin's.
    node: Option<String>,
    not_before: jiff::Timestamp,
    not_after: jiff::Timestamp,
    revoked: bool,
}

/// What the x509 authenticator makes of a request's client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum X509 {
    /// No certificate was presented.
    None,
    /// A valid certificate of this user (`Some(node)`, or `None` for an admin).
    User(Option<String>),
    /// A certificate that does not authenticate anyone (expired, not yet valid, revoked, or not issued here).
    Invalid,
}

/// A client certificate and its key, PEM encoded. `Debug` leaves the key out.
#[derive(Clone)]
pub struct ClientCertificate {
    /// The certificate.
    pub cert_pem: String,
    /// Its PKCS #8 private key.
    pub key_pem: String,
    /// The certificate's DER, as a handshake presents it.
    pub(crate) der: Vec<u8>,
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

/// The server's TLS: its CA, its acceptor and the client certificates it issued.
pub(crate) struct Tls {
    ca: CertifiedIssuer<'static, KeyPair>,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    issued: Mutex<HashMap<Vec<u8>, Issued>>,
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn named(common: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, common);
    dn
}

fn offset(t: jiff::Timestamp) -> std::io::Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second()).map_err(other)
}

impl Tls {
    /// A new CA and a serving certificate signed by it.
    pub(crate) fn new() -> std::io::Result<Self> {
        let mut params = CertificateParams::default();
        params.distinguished_name = named("nodewarden-testapi-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(other)?).map_err(other)?;
        let mut serving = CertificateParams::default();
        serving.distinguished_name = named("kube-apiserver", None);
        serving.subject_alt_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::DnsName("localhost".try_into().map_err(other)?),
            SanType::DnsName("kubernetes.default.svc".try_into().map_err(other)?),
        ];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(other)?;
        let cert = serving.signed_by(&key, &ca).map_err(other)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(AskForCertificate { algorithms: provider.signature_verification_algorithms });
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(other)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![cert.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(other)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Ok(Self { ca, acceptor, issued: Mutex::new(HashMap::new()) })
    }

    /// The CA's certificate, PEM encoded (a kubeconfig's `certificate-authority-data`).
    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// Issues a client certificate for `node` (`None`: an admin), valid from `not_before` for `valid_for`.
    pub(crate) fn issue(
        &self,
        node: Option<&str>,
        not_before: jiff::Timestamp,
        valid_for: Duration,
    ) -> std::io::Result<ClientCertificate> {
        let not_after = not_before + jiff::SignedDuration::try_from(valid_for).map_err(other)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = match node {
            Some(n) => named(&format!("system:node:{n}"), Some("system:nodes")),
            None => named("admin", Some("system:masters")),
        };
        params.not_before = offset(not_before)?;
        params.not_after = offset(not_after)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().map_err(other)?;
        let cert = params.signed_by(&key, &self.ca).map_err(other)?;
        let issued = Issued { node: node.map(str::to_owned), not_before, not_after, revoked: false };
        let der = cert.der().to_vec();
        self.issued.lock().unwrap_or_else(PoisonError::into_inner).insert(der.clone(), issued);
        Ok(ClientCertificate { cert_pem: cert.pem(), key_pem: key.serialize_pem(), der })
    }

    /// Refuses `cert` from now on (as a certificate past its end would be).
    pub(crate) fn revoke(&self, cert: &ClientCertificate) {
        if let Some(i) = self.issued.lock().unwrap_or_else(PoisonError::into_inner).get_mut(&cert.der) {
            i.revoked = true;
        }
    }

    /// The x509 authenticator: who a connection's client certificate (its DER, if any) names at `now`.
    pub(crate) fn authenticate(&self, der: Option<&[u8]>, now: jiff::Timestamp) -> X509 {
        let Some(der) = der else { return X509::None };
        match self.issued.lock().unwrap_or_else(PoisonError::into_inner).get(der) {
            Some(i) if !i.revoked && i.not_before <= now && now < i.not_after => X509::User(i.node.clone()),
            _ => X509::Invalid,
        }
    }
}

/// Asks for a client certificate without requiring one, and checks only that the client holds its key: whom it
/// names is the authenticator's to decide, after the handshake, as the apiserver's `RequestClientCert`.
#[derive(Debug)]
struct AskForCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AskForCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[HintName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_its_user_only_while_it_is_valid_and_not_revoked() {
        let tls = Tls::new().unwrap();
        let now = jiff::Timestamp::now();
        let node = tls.issue(Some("n1"), now, Duration::from_secs(60)).unwrap();
        let der = node.der.clone();
        assert_eq!(tls.authenticate(Some(&der), now), X509::User(Some("n1".into())));
        assert_eq!(tls.authenticate(Some(&der), now + jiff::SignedDuration::from_secs(61)), X509::Invalid, "expired");
        assert_eq!(tls.authenticate(Some(&der), now - jiff::SignedDuration::from_secs(1)), X509::Invalid, "early");
        let admin = tls.issue(None, now, Duration::from_secs(60)).unwrap();
        assert_eq!(tls.authenticate(Some(&admin.der), now), X509::User(None));
        tls.revoke(&node);
        assert_eq!(tls.authenticate(Some(&der), now), X509::Invalid, "revoked");
        assert_eq!(tls.authenticate(Some(b"not one of ours"), now), X509::Invalid);
        assert_eq!(tls.authenticate(None, now), X509::None);
        assert!(tls.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(node.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    }
}
