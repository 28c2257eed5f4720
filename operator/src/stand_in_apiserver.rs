//! For unit tests: a stand-in apiserver on loopback, serving the routes a test gives it, and a
//! client of it.

/// A client of `app`, served on a free loopback port for as long as the test's runtime runs.
pub(crate) async fn client_of(app: axum::Router) -> kube::Client {
    kube::Client::try_from(config_of(app).await).expect("a client")
}

/// A client configuration for `app`, served as [`client_of`] serves it.
pub(crate) async fn config_of(app: axum::Router) -> kube::Config {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    kube::Config::new(url.parse().expect("a URL"))
}

/// A `Status` answer as the apiserver writes one: a success for a 2xx `code`, else a failure
/// for `reason`.
pub(crate) fn status(
    code: u16,
    reason: &str,
    message: &str,
) -> (axum::http::StatusCode, axum::Json<serde_json::Value>) {
    let outcome = if (200..300).contains(&code) {
        "Success"
    } else {
        "Failure"
    };
    (
        axum::http::StatusCode::from_u16(code).expect("an HTTP status code"),
        axum::Json(
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": outcome, "code": code, "reason": reason, "message": message}),
        ),
    )
}
