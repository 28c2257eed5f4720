//! For unit tests: a stand-in apiserver on loopback, serving the routes a test gives it, and a
//! client of it.

/// A client of `app`, served on a free loopback port for as long as the test's runtime runs.
pub(crate) async fn client_of(app: axum::Router) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    kube::Client::try_from(kube::Config::new(url.parse().expect("a URL"))).expect("a client")
}
