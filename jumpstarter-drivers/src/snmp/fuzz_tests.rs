//! Fuzz targets of SNMP's parsers of outside input: the BER reader (`ber.rs`), the
//! manager's decoding of an agent's answers (`agent.rs`, driven over loopback against a fake
//! agent that answers with garbage, mutated and tweaked messages before the right one) and
//! the `oid` config field. The case count is [`crate::fuzz_tests::fuzz_config`]'s.

use std::{sync::OnceLock, time::Duration};

use proptest::prelude::*;
use tokio::net::UdpSocket;

use super::{
    agent::{Agent, Security},
    ber::{self, Reader, Tlv},
    error::SnmpError,
    parse_oid,
    usm::{self, AUTH_PARAMS_LEN, AuthProto, PrivProto},
};
use crate::fuzz_tests::{Shown, edits, fuzz_config, mutate_bytes, runtime};

/// A BER value as the reader sees it, for the round-trip checks.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Integer(i64),
    Octets(Vec<u8>),
    Oid(Vec<u32>),
    Constructed(u8, Vec<Value>),
}

fn encode(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Integer(i) => ber::integer(out, *i),
        Value::Octets(o) => ber::octets(out, o),
        Value::Oid(arcs) => ber::oid(out, arcs).expect("oid_arcs() gives encodable OIDs"),
        Value::Constructed(tag, children) => {
            let mut content = Vec::new();
            for c in children {
                encode(&mut content, c);
            }
            ber::tlv(out, *tag, &content);
        }
    }
}

/// OIDs the encoder takes (at least two arcs, the first 0..=2, the second below 40 unless
/// the first is 2) and whose first subidentifier fits the decoder's u32.
fn oid_arcs() -> impl Strategy<Value = Vec<u32>> {
    let arc = prop_oneof![0u32..200, any::<u32>()];
    (0u32..=2, any::<u32>(), prop::collection::vec(arc, 0..12)).prop_map(|(a, b, rest)| {
        let b = if a < 2 { b % 40 } else { b.min(u32::MAX - 80) };
        [vec![a, b], rest].concat()
    })
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(Value::Integer),
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..200),
            1 => prop::collection::vec(any::<u8>(), 0..70_000),
        ]
        .prop_map(Value::Octets),
        oid_arcs().prop_map(Value::Oid),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        (
            prop::sample::select(vec![
                ber::SEQUENCE,
                ber::GET_REQUEST,
                ber::RESPONSE,
                ber::SET_REQUEST,
                ber::REPORT,
            ]),
            prop::collection::vec(inner, 0..6),
        )
            .prop_map(|(tag, children)| Value::Constructed(tag, children))
    })
}

/// Reads every TLV of `r` as [`Value`]s, descending into constructed ones (tag bit 0x20);
/// `None` for what the reader refuses.
fn read_all(mut r: Reader<'_>, depth: u32) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    while !r.is_empty() {
        let t = r.read().ok()?;
        out.push(read_one(&t, depth)?);
    }
    Some(out)
}

fn read_one(t: &Tlv<'_>, depth: u32) -> Option<Value> {
    Some(match t.tag {
        ber::INTEGER => Value::Integer(t.integer().ok()?),
        ber::OCTET_STRING => Value::Octets(t.octets().ok()?.to_vec()),
        ber::OID => Value::Oid(t.oid().ok()?),
        tag if tag & 0x20 != 0 && depth < 8 => {
            Value::Constructed(tag, read_all(t.reader(), depth + 1)?)
        }
        _ => return None,
    })
}

/// Walks any bytes as TLVs, calling every accessor on each (none may panic), and checks that
/// what is read re-encodes to something that reads back the same.
fn walk(buf: &[u8], depth: u32) -> Result<(), TestCaseError> {
    let mut r = Reader::new(buf);
    while !r.is_empty() {
        let Ok(t) = r.read() else {
            return Ok(());
        };
        prop_assert!(t.offset <= buf.len() && t.offset + t.content.len() <= buf.len());
        // The TLV itself: tag and content read back from its (shortest-form) encoding.
        let mut again = Vec::new();
        ber::tlv(&mut again, t.tag, t.content);
        let t2 = Reader::new(&again)
            .read()
            .expect("an encoded TLV reads back");
        prop_assert_eq!((t2.tag, t2.content), (t.tag, t.content));
        if let Ok(i) = t.integer() {
            let mut e = Vec::new();
            ber::integer(&mut e, i);
            prop_assert_eq!(
                Reader::new(&e).read().and_then(|t| t.integer()).ok(),
                Some(i)
            );
        }
        let _ = t.octets();
        if let Ok(arcs) = t.oid() {
            let mut e = Vec::new();
            let encoded = ber::oid(&mut e, &arcs);
            prop_assert!(
                encoded.is_ok(),
                "{:?} reads but does not encode: {:?}",
                arcs,
                encoded
            );
            prop_assert_eq!(
                Reader::new(&e).read().and_then(|t| t.oid()).ok(),
                Some(arcs)
            );
        }
        let _ = r.clone().expect(t.tag, "anything");
        if t.tag & 0x20 != 0 && depth < 8 {
            walk(t.content, depth + 1)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// A fake agent on loopback (RFC 3412 messages, RFC 3414 USM)

const AGENT_ENGINE: &[u8] = b"\x80\x00\x1f\x88\x04fuzz";
const BOOTS: u32 = 7;
const TIME: u32 = 1234;
const TARGET_OID: &[u32] = &[1, 3, 6, 1, 4, 1, 13742, 6, 4, 1, 2, 1, 2, 1, 3];
const UNKNOWN_ENGINE_ID: &[u32] = &[1, 3, 6, 1, 6, 3, 15, 1, 1, 4, 0];
const NOT_IN_TIME_WINDOW: &[u32] = &[1, 3, 6, 1, 6, 3, 15, 1, 1, 2, 0];

/// The four security levels and protocols, with master keys (computed once: 1 MiB each).
fn securities() -> &'static [Security] {
    static S: OnceLock<Vec<Security>> = OnceLock::new();
    S.get_or_init(|| {
        vec![
            Security::None,
            Security::Auth {
                proto: AuthProto::Md5,
                key: usm::password_to_key(AuthProto::Md5, b"authpass"),
            },
            Security::Priv {
                proto: AuthProto::Sha,
                key: usm::password_to_key(AuthProto::Sha, b"authpass"),
                priv_proto: PrivProto::Des,
                priv_key: usm::password_to_key(AuthProto::Sha, b"privpass"),
            },
            Security::Priv {
                proto: AuthProto::Md5,
                key: usm::password_to_key(AuthProto::Md5, b"authpass"),
                priv_proto: PrivProto::Aes,
                priv_key: usm::password_to_key(AuthProto::Md5, b"privpass"),
            },
        ]
    })
}

type AuthKey = Option<(AuthProto, Vec<u8>)>;
type PrivKey = Option<(PrivProto, Vec<u8>)>;

/// The user's keys localized to `engine` (RFC 3414 A.2.2).
fn localized(sec: &Security, engine: &[u8]) -> (AuthKey, PrivKey) {
    match sec {
        Security::None => (None, None),
        Security::Auth { proto, key } => (Some((*proto, usm::localize(*proto, key, engine))), None),
        Security::Priv {
            proto,
            key,
            priv_proto,
            priv_key,
        } => (
            Some((*proto, usm::localize(*proto, key, engine))),
            Some((*priv_proto, usm::localize(*proto, priv_key, engine))),
        ),
    }
}

/// What the agent reads of a request.
#[derive(Debug)]
struct Request {
    msg_id: i64,
    flags: u8,
    engine: Vec<u8>,
    pdu_tag: u8,
    request_id: i64,
    varbinds: Vec<u8>,
}

/// Reads a request of the manager, checking its authentication and decrypting it as an
/// agent would; an error names what the manager got wrong.
fn read_request(buf: &[u8], sec: &Security) -> Result<Request, String> {
    let e = |e: SnmpError| e.to_string();
    let mut m = Reader::new(buf)
        .expect(ber::SEQUENCE, "message")
        .map_err(e)?
        .reader();
    if m.read().and_then(|t| t.integer()).map_err(e)? != 3 {
        return Err("not SNMPv3".into());
    }
    let mut g = m.expect(ber::SEQUENCE, "global").map_err(e)?.reader();
    let msg_id = g.read().and_then(|t| t.integer()).map_err(e)?;
    let _max = g.read().and_then(|t| t.integer()).map_err(e)?;
    let flags = g
        .read()
        .and_then(|t| t.octets().map(|o| o.first().copied().unwrap_or(0)))
        .map_err(e)?;
    let sec_params = m.expect(ber::OCTET_STRING, "usm").map_err(e)?;
    let mut u = sec_params
        .reader()
        .expect(ber::SEQUENCE, "usm")
        .map_err(e)?
        .reader();
    let engine = u.read().and_then(|t| t.octets()).map_err(e)?.to_vec();
    let boots = u.read().and_then(|t| t.integer()).map_err(e)?;
    let time = u.read().and_then(|t| t.integer()).map_err(e)?;
    let _user = u.read().and_then(|t| t.octets()).map_err(e)?;
    let auth = u.read().map_err(e)?;
    let salt = u.read().and_then(|t| t.octets()).map_err(e)?;
    let data = m.read().map_err(e)?;
    let (auth_key, priv_key) = localized(sec, &engine);
    if flags & 1 != 0 {
        let (proto, key) = auth_key.ok_or("authenticated without a key")?;
        let mut zeroed = buf.to_vec();
        zeroed[auth.offset..auth.offset + AUTH_PARAMS_LEN].fill(0);
        if usm::hmac96(proto, &key, &zeroed)[..] != *auth.content {
            return Err("a wrong HMAC".into());
        }
    }
    let plain;
    let scoped = if flags & 2 != 0 {
        let (proto, key) = priv_key.ok_or("encrypted without a key")?;
        let salt: [u8; 8] = salt.try_into().map_err(|_| "a salt of a bad length")?;
        plain = usm::decrypt(
            proto,
            &key,
            u32::try_from(boots).map_err(|_| "boots")?,
            u32::try_from(time).map_err(|_| "time")?,
            salt,
            data.octets().map_err(e)?,
        )
        .map_err(e)?;
        Reader::new(&plain)
            .expect(ber::SEQUENCE, "scoped")
            .map_err(e)?
    } else {
        data
    };
    let mut s = scoped.reader();
    let _ctx_engine = s.read().map_err(e)?;
    let _ctx_name = s.read().map_err(e)?;
    let pdu = s.read().map_err(e)?;
    let mut p = pdu.reader();
    let request_id = p.read().and_then(|t| t.integer()).map_err(e)?;
    let _ = p.read().map_err(e)?;
    let _ = p.read().map_err(e)?;
    let varbinds = p
        .expect(ber::SEQUENCE, "varbinds")
        .map_err(e)?
        .content
        .to_vec();
    Ok(Request {
        msg_id,
        flags,
        engine,
        pdu_tag: pdu.tag,
        request_id,
        varbinds,
    })
}

/// An answer's PDU and how it is sent.
#[derive(Debug, Clone)]
struct Answer {
    msg_id: i64,
    /// `msgFlags` auth (1) and priv (2) bits.
    level: u8,
    /// The engine in `msgSecurityParameters`, whose keys sign and encrypt.
    engine: Vec<u8>,
    pdu_tag: u8,
    request_id: i64,
    error_status: i64,
    error_index: i64,
    varbinds: Vec<u8>,
}

/// Encodes an answer as an agent would (RFC 3412 6, RFC 3414 3.1).
fn encode_answer(a: &Answer, sec: &Security) -> Vec<u8> {
    let (auth_key, priv_key) = localized(sec, &a.engine);
    let mut pdu_body = Vec::new();
    ber::integer(&mut pdu_body, a.request_id);
    ber::integer(&mut pdu_body, a.error_status);
    ber::integer(&mut pdu_body, a.error_index);
    ber::tlv(&mut pdu_body, ber::SEQUENCE, &a.varbinds);
    let mut scoped_body = Vec::new();
    ber::octets(&mut scoped_body, &a.engine);
    ber::octets(&mut scoped_body, b"");
    ber::tlv(&mut scoped_body, a.pdu_tag, &pdu_body);
    let mut scoped = Vec::new();
    ber::tlv(&mut scoped, ber::SEQUENCE, &scoped_body);
    let (data, salt) = match (&priv_key, a.level & 2 != 0) {
        (Some((proto, key)), true) => {
            let salt = [9, 8, 7, 6, 5, 4, 3, 2];
            let enc = usm::encrypt(*proto, key, BOOTS, TIME, salt, &scoped).expect("encrypt");
            let mut d = Vec::new();
            ber::octets(&mut d, &enc);
            (d, salt.to_vec())
        }
        _ => (scoped, Vec::new()),
    };
    let auth = auth_key.filter(|_| a.level & 1 != 0);
    let mut global = Vec::new();
    ber::integer(&mut global, a.msg_id);
    ber::integer(&mut global, 65507);
    ber::octets(&mut global, &[a.level]);
    ber::integer(&mut global, 3);
    let mut usm_body = Vec::new();
    ber::octets(&mut usm_body, &a.engine);
    ber::integer(&mut usm_body, i64::from(BOOTS));
    ber::integer(&mut usm_body, i64::from(TIME));
    ber::octets(&mut usm_body, b"fuzz");
    let placeholder = if auth.is_some() {
        &[0u8; AUTH_PARAMS_LEN][..]
    } else {
        &[][..]
    };
    ber::octets(&mut usm_body, placeholder);
    ber::octets(&mut usm_body, &salt);
    let mut usm_seq = Vec::new();
    ber::tlv(&mut usm_seq, ber::SEQUENCE, &usm_body);
    let mut body = Vec::new();
    ber::integer(&mut body, 3);
    ber::tlv(&mut body, ber::SEQUENCE, &global);
    ber::octets(&mut body, &usm_seq);
    body.extend_from_slice(&data);
    let mut msg = Vec::new();
    ber::tlv(&mut msg, ber::SEQUENCE, &body);
    if let Some((proto, key)) = auth {
        // The auth parameters are the 12 zero bytes in the USM sequence.
        let at = msg
            .windows(AUTH_PARAMS_LEN + 2)
            .position(|w| w[0] == ber::OCTET_STRING && w[1] == 12 && w[2..].iter().all(|b| *b == 0))
            .expect("the placeholder")
            + 2;
        let mac = usm::hmac96(proto, &key, &msg);
        msg[at..at + AUTH_PARAMS_LEN].copy_from_slice(&mac);
    }
    msg
}

fn varbind(oid: &[u32]) -> Vec<u8> {
    let mut vb = Vec::new();
    ber::oid(&mut vb, oid).expect("an encodable OID");
    ber::tlv(&mut vb, 0x41, &[1]); // Counter32
    let mut out = Vec::new();
    ber::tlv(&mut out, ber::SEQUENCE, &vb);
    out
}

/// The right answer to a request: a discovery report, or a `noError` response at the
/// request's security level.
fn right_answer(req: &Request) -> Answer {
    let discovery = req.pdu_tag == ber::GET_REQUEST;
    Answer {
        msg_id: req.msg_id,
        level: if discovery { 0 } else { req.flags & 3 },
        engine: if discovery {
            AGENT_ENGINE.to_vec()
        } else {
            req.engine.clone()
        },
        pdu_tag: if discovery {
            ber::REPORT
        } else {
            ber::RESPONSE
        },
        request_id: req.request_id,
        error_status: 0,
        error_index: 0,
        varbinds: if discovery {
            varbind(UNKNOWN_ENGINE_ID)
        } else {
            req.varbinds.clone()
        },
    }
}

/// What the agent sends before the right answer.
#[derive(Debug, Clone)]
enum Before {
    Nothing,
    /// Random bytes.
    Garbage(Shown),
    /// The right answer with bytes replaced, inserted or removed.
    Mutated(Vec<(prop::sample::Index, u8, u8)>),
    /// The right answer, in plain text without authentication, with this error status.
    Unauthenticated(i64),
    /// The right answer with other PDU fields (the tag, error status and index, varbinds).
    Tweaked {
        pdu_tag: u8,
        error_status: i64,
        error_index: i64,
        oids: Vec<Vec<u32>>,
    },
}

fn before() -> impl Strategy<Value = Before> {
    prop_oneof![
        1 => Just(Before::Nothing),
        2 => prop::collection::vec(any::<u8>(), 0..200).prop_map(|b| Before::Garbage(Shown(b))),
        4 => edits().prop_map(Before::Mutated),
        2 => (
            prop::sample::select(vec![ber::RESPONSE, ber::REPORT, ber::GET_REQUEST, 0xa4, 0x30]),
            prop_oneof![Just(0i64), 0i64..20, any::<i64>()],
            prop_oneof![0i64..3, any::<i64>()],
            prop::collection::vec(
                prop_oneof![
                    oid_arcs(),
                    Just(NOT_IN_TIME_WINDOW.to_vec()),
                    (1u32..8).prop_map(|k| [&UNKNOWN_ENGINE_ID[..9], &[k, 0]].concat()),
                    Just(vec![1, 3, 6, 1, 6, 3, 11, 2, 1, 1, 0]),
                ],
                0..3,
            ),
        )
            .prop_map(|(pdu_tag, error_status, error_index, oids)| Before::Tweaked {
                pdu_tag,
                error_status,
                error_index,
                oids,
            }),
    ]
}

/// The bytes sent before the right answer `right`.
fn before_bytes(b: &Before, right: &Answer, sec: &Security) -> Option<Vec<u8>> {
    match b {
        Before::Nothing => None,
        Before::Garbage(g) => Some(g.0.clone()),
        Before::Mutated(e) => Some(mutate_bytes(&encode_answer(right, sec), e)),
        Before::Unauthenticated(status) => {
            let mut a = right.clone();
            a.level = 0;
            a.error_status = *status;
            Some(encode_answer(&a, sec))
        }
        Before::Tweaked {
            pdu_tag,
            error_status,
            error_index,
            oids,
        } => {
            let mut a = right.clone();
            a.pdu_tag = *pdu_tag;
            a.error_status = *error_status;
            a.error_index = *error_index;
            a.varbinds = oids.iter().flat_map(|o| varbind(o)).collect();
            Some(encode_answer(&a, sec))
        }
    }
}

/// Serves requests on `sock`: to the n-th, `script[n]` then the right answer.
async fn fake_agent(sock: UdpSocket, sec: Security, script: Vec<Before>) -> Result<(), String> {
    let mut buf = vec![0u8; 65_536];
    for n in 0.. {
        let (len, peer) = sock.recv_from(&mut buf).await.map_err(|e| e.to_string())?;
        let req = read_request(&buf[..len], &sec)
            .map_err(|e| format!("the manager's request {n} is wrong: {e}"))?;
        let right = right_answer(&req);
        if let Some(b) = script.get(n).and_then(|b| before_bytes(b, &right, &sec)) {
            let _ = sock.send_to(&b, peer).await;
        }
        let _ = sock.send_to(&encode_answer(&right, &sec), peer).await;
    }
    Ok(())
}

/// Runs a SET of INTEGER 1 against a fake agent with `script`; the manager's result.
async fn set_against(
    sec: &Security,
    script: Vec<Before>,
) -> Result<Result<(), SnmpError>, TestCaseError> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let agent = Agent {
        addr: sock.local_addr().expect("addr"),
        user: "fuzz".into(),
        security: sec.clone(),
    };
    let server = tokio::spawn(fake_agent(sock, sec.clone(), script));
    let result = agent
        .set_integer(TARGET_OID, 1, Duration::from_secs(10))
        .await;
    if server.is_finished() {
        match server.await {
            Ok(Err(e)) => return Err(TestCaseError::fail(e)),
            Err(e) => return Err(TestCaseError::fail(format!("the fake agent: {e}"))),
            Ok(Ok(())) => {}
        }
    } else {
        server.abort();
    }
    Ok(result)
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// Any bytes, as a message from the network: every TLV's accessors refuse or read
    /// without panicking, and what is read re-encodes to what reads back the same.
    #[test]
    fn ber_from_the_network_never_panics_and_round_trips(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300).prop_map(Shown),
            (value(), edits()).prop_map(|(v, e)| {
                let mut b = Vec::new();
                encode(&mut b, &v);
                Shown(mutate_bytes(&b, &e))
            }),
        ],
    ) {
        walk(&bytes.0, 0)?;
    }

    /// Encoded values (nested sequences and PDUs of INTEGERs, OCTET STRINGs of any length,
    /// OIDs) read back as themselves.
    #[test]
    fn ber_values_round_trip(v in value()) {
        let mut b = Vec::new();
        encode(&mut b, &v);
        let mut r = Reader::new(&b);
        let t = r.read().expect("reads");
        prop_assert!(r.is_empty());
        prop_assert_eq!(read_one(&t, 0), Some(v));
    }

    /// The `oid` config field: any text is refused or parses to an OID that, with a plug
    /// appended, is encoded and decoded back to itself.
    #[test]
    fn configured_oids_parse_or_are_refused_and_round_trip(
        text in prop_oneof![
            any::<String>(),
            (Just("1.3.6.1.4.1.13742.6.4.1.2.1.2.1"), edits())
                .prop_map(|(s, e)| String::from_utf8_lossy(&mutate_bytes(s.as_bytes(), &e)).into_owned()),
            prop::collection::vec(prop_oneof![0u64..100, Just(u64::from(u32::MAX)), any::<u64>()], 0..6)
                .prop_map(|a| a.iter().map(u64::to_string).collect::<Vec<_>>().join(".")),
        ],
        plug in any::<u32>(),
    ) {
        if let Ok(mut arcs) = parse_oid(&text) {
            arcs.push(plug);
            let mut b = Vec::new();
            let encoded = ber::oid(&mut b, &arcs);
            prop_assert!(encoded.is_ok(), "{}: accepted, and encoding it fails: {:?}", text, encoded);
            prop_assert_eq!(Reader::new(&b).read().and_then(|t| t.oid()).ok(), Some(arcs));
        }
    }

    /// The manager against an agent that sends, before each right answer, garbage, a
    /// mutation of it or a tweaked PDU, at every security level. Never a panic, never a
    /// wait past the deadline: garbage is dropped (the SET succeeds); a mutated or tweaked
    /// answer is dropped or read for what it says.
    #[test]
    fn agent_answers_from_the_network_never_panic(
        sec in 0usize..4,
        discovery in before(),
        response in before(),
    ) {
        let sec = &securities()[sec];
        let started = std::time::Instant::now();
        let result = runtime().block_on(set_against(sec, vec![discovery.clone(), response.clone()]))?;
        prop_assert!(started.elapsed() < Duration::from_secs(9), "{:?} took {:?}", result, started.elapsed());
        let garbage_only = |b: &Before| matches!(b, Before::Nothing | Before::Garbage(_));
        match &result {
            Ok(()) => {}
            Err(e) if garbage_only(&discovery) && garbage_only(&response) => {
                prop_assert!(false, "garbage made the SET fail: {}", e);
            }
            Err(SnmpError::Status { .. } | SnmpError::Report { .. } | SnmpError::Malformed(_) | SnmpError::WrongDigest) => {}
            Err(e) => prop_assert!(false, "{}", e),
        }
        // A tweaked response is read for what it says.
        if garbage_only(&discovery)
            && let Before::Tweaked { pdu_tag, error_status, oids, .. } = &response
        {
            match *pdu_tag {
                ber::RESPONSE if *error_status == 0 => prop_assert!(result.is_ok(), "{:?}", result),
                ber::RESPONSE => prop_assert!(matches!(result, Err(SnmpError::Status { .. })), "{:?}", result),
                // notInTimeWindow: the manager takes the engine's clock and asks again.
                ber::REPORT if oids.first().map(Vec::as_slice) == Some(NOT_IN_TIME_WINDOW) => {
                    prop_assert!(result.is_ok(), "{:?}", result);
                }
                ber::REPORT => prop_assert!(matches!(result, Err(SnmpError::Report { .. })), "{:?}", result),
                _ => prop_assert!(matches!(result, Err(SnmpError::Malformed(_))), "{:?}", result),
            }
        }
    }

    /// The `oid` config field: an OID whose first subidentifier (`40 * 2 + second`) does not
    /// fit in 32 bits is refused, or encoded to itself (never an overflow: a panic in a debug
    /// build, a SET of another OID in a release build).
    #[test]
    fn configured_oids_whose_first_subidentifier_overflows_are_refused(
        second in (u32::MAX - 79)..=u32::MAX,
        rest in prop::collection::vec(0u32..100, 0..4),
    ) {
        let text = [vec![2, second], rest].concat().iter().map(u32::to_string).collect::<Vec<_>>().join(".");
        if let Ok(arcs) = parse_oid(&text) {
            let encoded = std::panic::catch_unwind(|| {
                let mut b = Vec::new();
                ber::oid(&mut b, &arcs).map(|()| b)
            });
            let Ok(b) = encoded else {
                return Err(TestCaseError::fail(format!("{text}: accepted, and encoding it panics")));
            };
            let b = b.map_err(|e| TestCaseError::fail(format!("{text}: accepted, and encoding it fails: {e}")))?;
            prop_assert_eq!(Reader::new(&b).read().and_then(|t| t.oid()).ok(), Some(arcs), "{}", text);
        }
    }

    /// RFC 3412 7.2.10 / RFC 3414 3.2: a Response must come at the security level of the
    /// request; one in plain text without authentication, to an authenticated request, is
    /// dropped (whoever can see the request could forge it).
    #[test]
    fn unauthenticated_responses_to_authenticated_requests_are_dropped(
        sec in 1usize..4,
        error_status in 1i64..6,
    ) {
        let sec = &securities()[sec];
        let script = vec![Before::Nothing, Before::Unauthenticated(error_status)];
        let result = runtime().block_on(set_against(sec, script))?;
        prop_assert!(result.is_ok(), "a forged answer was taken: {:?}", result);
    }
}

/// X.690 8.19: an OBJECT IDENTIFIER has at least one subidentifier (two arcs); empty
/// contents, which would read as no arcs (and re-encode as `0.0`), are refused.
#[test]
fn empty_oids_are_refused() {
    let t = Reader::new(&[ber::OID, 0]).read().expect("a TLV");
    assert!(t.oid().is_err(), "{:?}", t.oid());
}
