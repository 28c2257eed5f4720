//! What a failed HTTP call to a sink or an upstream says about its cause, in words and as a
//! metric label. reqwest's own text stops at "error sending request for url (…)"; the cause a
//! user needs (the name did not resolve, the port refused, TLS, a timeout) is further down the
//! error's source chain.

/// An error and its causes, `a: b: c` (each cause once).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Labels [`kind`] can return.
pub const KINDS: &[&str] = &["dns", "refused", "timeout", "tls", "connect", "broken"];

/// The cause of a failed request, from its chain's text (sans-IO): `dns` (the name does not
/// resolve), `refused`, `timeout`, `tls`, `connect` (another connect failure), `broken` (the
/// connection failed after it was made).
pub fn kind(chain: &str, timed_out: bool, connecting: bool) -> &'static str {
    let text = chain.to_ascii_lowercase();
    if text.contains("dns error")
        || text.contains("failed to lookup address")
        || text.contains("name or service not known")
        || text.contains("no address associated")
        || text.contains("temporary failure in name resolution")
    {
        "dns"
    } else if timed_out || text.contains("timed out") {
        "timeout"
    } else if text.contains("connection refused") {
        "refused"
    } else if text.contains("certificate") || text.contains("tls") || text.contains("ssl") {
        "tls"
    } else if connecting {
        "connect"
    } else {
        "broken"
    }
}

/// [`error_chain`] and [`kind`] of a reqwest error.
pub fn describe(e: &reqwest::Error) -> (&'static str, String) {
    let chain = error_chain(e);
    (kind(&chain, e.is_timeout(), e.is_connect()), chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_named_from_the_chain() {
        let dns = "error sending request for url (http://x.ns.svc:8100/): client error (Connect): \
                   dns error: failed to lookup address information: Name or service not known";
        assert_eq!(kind(dns, false, true), "dns");
        let refused = "error sending request: client error (Connect): tcp connect error: \
                       Connection refused (os error 111)";
        assert_eq!(kind(refused, false, true), "refused");
        assert_eq!(kind("operation timed out", false, true), "timeout");
        assert_eq!(kind("error sending request", true, false), "timeout");
        assert_eq!(
            kind("invalid peer certificate: UnknownIssuer", false, true),
            "tls"
        );
        assert_eq!(kind("client error (Connect)", false, true), "connect");
        assert_eq!(
            kind("connection closed before message completed", false, false),
            "broken"
        );
        for k in ["dns", "refused", "timeout", "tls", "connect", "broken"] {
            assert!(KINDS.contains(&k));
        }
    }

    #[test]
    fn the_chain_lists_each_cause_once() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E(
            "outer",
            Some(Box::new(E("middle", Some(Box::new(E("outer", None)))))),
        );
        assert_eq!(error_chain(&e), "outer: middle");
    }
}
