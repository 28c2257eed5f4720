//! The real node's cluster DNS: what CoreDNS's `kubernetes` plugin does for a real cluster,
//! reduced to what floe uses. Debian packages no Kubernetes-aware DNS server, and floe's pods
//! reach their job's Services by name (`<job>-dataset.<ns>.svc:8100`), so the node's kubelet
//! points pods at this responder (`--cluster-dns`, the bridge address) and a test serves it for
//! as long as it runs.
//!
//! It answers A queries for `<service>.<namespace>.svc.cluster.local` with the Service's
//! ClusterIP, read from the apiserver at the time of the query; a name in the cluster domain
//! that names no Service is NXDOMAIN; every other name is REFUSED. Nothing is ever forwarded:
//! a test's pods can resolve nothing outside the cluster.

use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client};

const CLUSTER_DOMAIN: &str = "svc.cluster.local";
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
const NXDOMAIN: u8 = 3;
const REFUSED: u8 = 5;
const FORMERR: u8 = 1;

/// One question of a query, as this responder reads it.
#[derive(Debug, PartialEq)]
pub struct Question {
    pub id: u16,
    /// Lower case, without the trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question section's bytes (echoed in the answer).
    raw: Vec<u8>,
    recursion_desired: bool,
}

/// Parse a query with exactly one question; `None` for anything else (answered FORMERR when
/// at least the id can be read).
pub fn parse_query(packet: &[u8]) -> Option<Question> {
    let header = packet.get(..12)?;
    let id = u16::from_be_bytes([header[0], header[1]]);
    let is_query = header[2] & 0x80 == 0;
    let qdcount = u16::from_be_bytes([header[4], header[5]]);
    if !is_query || qdcount != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*packet.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers never appear in a question of a query.
        if len > 63 {
            return None;
        }
        let label = packet.get(at..at + len)?;
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let fixed = packet.get(at..at + 4)?;
    Some(Question {
        id,
        name: labels.join("."),
        qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
        qclass: u16::from_be_bytes([fixed[2], fixed[3]]),
        raw: packet[12..at + 4].to_vec(),
        recursion_desired: header[2] & 0x01 != 0,
    })
}

/// What a name means to this responder.
#[derive(Debug, PartialEq)]
pub enum Lookup<'a> {
    /// `<service>.<namespace>.svc.cluster.local`.
    Service { name: &'a str, namespace: &'a str },
    /// In the cluster domain but not a Service name (answered NXDOMAIN).
    Unknown,
    /// Outside the cluster domain (answered REFUSED: never forwarded).
    Outside,
}

pub fn classify(name: &str) -> Lookup<'_> {
    let Some(rest) = name.strip_suffix(CLUSTER_DOMAIN) else {
        return if name == "cluster.local" || name.ends_with(".cluster.local") {
            Lookup::Unknown
        } else {
            Lookup::Outside
        };
    };
    let Some(rest) = rest.strip_suffix('.') else {
        return Lookup::Unknown;
    };
    match rest.split('.').collect::<Vec<_>>().as_slice() {
        [name, namespace] => Lookup::Service { name, namespace },
        _ => Lookup::Unknown,
    }
}

/// The reply to `q`: `address` answers an A question; `rcode` is 0 (also for a name that exists
/// with no record of the asked type), NXDOMAIN, REFUSED.
pub fn answer(q: &Question, rcode: u8, address: Option<Ipv4Addr>) -> Vec<u8> {
    let address = address.filter(|_| rcode == 0 && q.qtype == TYPE_A && q.qclass == CLASS_IN);
    let mut out = Vec::with_capacity(12 + q.raw.len() + 16);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, authoritative for the cluster domain, RD echoed; RA off: this server never recurses.
    out.push(0x84 | u8::from(q.recursion_desired));
    out.push(rcode & 0x0f);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::from(address.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&q.raw);
    if let Some(ip) = address {
        out.extend_from_slice(&[0xc0, 12]); // the name: a pointer to the question's
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&5u32.to_be_bytes()); // TTL: Services come and go within a test
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&ip.octets());
    }
    out
}

fn formerr(packet: &[u8]) -> Option<Vec<u8>> {
    let id = packet.get(..2)?;
    Some(vec![id[0], id[1], 0x84, FORMERR, 0, 0, 0, 0, 0, 0, 0, 0])
}

/// The responder on `addr` (UDP), answering from `client`'s Services until dropped.
pub struct ClusterDns {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClusterDns {
    pub async fn start(client: Client, addr: SocketAddr) -> anyhow::Result<Self> {
        let socket = tokio::net::UdpSocket::bind(addr).await?;
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 1500];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                let reply = match parse_query(&buf[..n]) {
                    Some(q) => {
                        let (rcode, ip) = resolve(&client, &q.name).await;
                        answer(&q, rcode, ip)
                    }
                    None => match formerr(&buf[..n]) {
                        Some(r) => r,
                        None => continue,
                    },
                };
                let _ = socket.send_to(&reply, peer).await;
            }
        });
        Ok(Self { task })
    }
}

async fn resolve(client: &Client, name: &str) -> (u8, Option<Ipv4Addr>) {
    match classify(name) {
        Lookup::Outside => (REFUSED, None),
        Lookup::Unknown => (NXDOMAIN, None),
        Lookup::Service { name, namespace } => {
            let api: Api<Service> = Api::namespaced(client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(svc)) => {
                    let ip = svc
                        .spec
                        .and_then(|s| s.cluster_ip)
                        .and_then(|ip| ip.parse().ok());
                    (0, ip)
                }
                Ok(None) => (NXDOMAIN, None),
                // The apiserver did not answer: SERVFAIL, so the resolver tries again.
                Err(_) => (2, None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            p.push(label.len() as u8);
            p.extend_from_slice(label.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&CLASS_IN.to_be_bytes());
        p
    }

    #[test]
    fn service_names_are_read_and_everything_else_is_not_ours() {
        let q = parse_query(&query("Job-Dataset.NS.svc.cluster.local", TYPE_A)).expect("query");
        assert_eq!(q.name, "job-dataset.ns.svc.cluster.local");
        assert_eq!(
            classify(&q.name),
            Lookup::Service {
                name: "job-dataset",
                namespace: "ns"
            }
        );
        // What a pod's resolver tries first for `x.ns.svc` (its search list).
        assert_eq!(classify("x.ns.svc.ns.svc.cluster.local"), Lookup::Unknown);
        assert_eq!(classify("cluster.local"), Lookup::Unknown);
        assert_eq!(classify("deb.example.org"), Lookup::Outside);
        assert_eq!(classify("svc.cluster.local.evil.org"), Lookup::Outside);
    }

    #[test]
    fn an_a_answer_is_well_formed_and_other_types_get_none() {
        let q = parse_query(&query("a.b.svc.cluster.local", TYPE_A)).expect("query");
        let r = answer(&q, 0, Some(Ipv4Addr::new(10, 96, 0, 7)));
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "one answer");
        assert_eq!(&r[r.len() - 4..], &[10, 96, 0, 7]);
        let aaaa = parse_query(&query("a.b.svc.cluster.local", 28)).expect("query");
        let r = answer(&aaaa, 0, Some(Ipv4Addr::new(10, 96, 0, 7)));
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0, "no AAAA record");
        let r = answer(&q, REFUSED, None);
        assert_eq!(r[3] & 0x0f, REFUSED);
    }

    #[test]
    fn malformed_packets_are_not_read() {
        assert!(parse_query(&[0; 5]).is_none());
        let mut p = query("a.b", TYPE_A);
        p[5] = 2; // two questions
        assert!(parse_query(&p).is_none());
        let mut p = query("a.b", TYPE_A);
        p.truncate(p.len() - 2);
        assert!(parse_query(&p).is_none());
        assert_eq!(formerr(&[1, 2, 3]).expect("id")[3], FORMERR);
    }
}
