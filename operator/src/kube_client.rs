//! The operator's apiserver client: kube-rs's stack (base URI, auth, extra headers, retries on
//! 429/503/504, timeouts) over a connection that speaks HTTP/2 when the apiserver offers it,
//! as client-go does. kube-rs's own builder speaks HTTP/1.1 only: one TCP+TLS connection per
//! request in flight, and each watch holds its own. A round that sends 16 claims at once then
//! opens up to 16 new connections at the moment the apiserver is busiest, and a TLS
//! handshake costs this apiserver about 3 ms of CPU (an idle pod PATCH costs about as much).
//! Over HTTP/2 every request and watch shares one connection that the watches keep warm.
//! `--kube-http1` (or a proxy in the kubeconfig) keeps kube-rs's HTTP/1.1 client.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

use crate::client_rate::RateLimit;

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection is dropped (and the watches on it restart): client-go's
/// `ReadIdleTimeout` and `PingTimeout` play the same part.
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the apiserver client: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid TLS server name {0:?} in the kubeconfig")]
    ServerName(String),
}

/// A client for `config`, every request through `limit`. HTTP/2 unless `http1_only` or the
/// kubeconfig names a proxy (kube-rs's builder handles proxies; it speaks HTTP/1.1).
pub fn build(config: Config, limit: RateLimit, http1_only: bool) -> Result<Client, ClientError> {
    if http1_only || config.proxy_url.is_some() {
        return Ok(ClientBuilder::try_from(config)?.with_layer(&limit).build());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = name
                .clone()
                .try_into()
                .map_err(|_| ClientError::ServerName(name.clone()))?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    // ALPN offers h2 first, then http/1.1: an apiserver behind something that cannot do
    // HTTP/2 still works.
    let https = builder.enable_http1().enable_http2().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_EVERY)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(limit)
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}
