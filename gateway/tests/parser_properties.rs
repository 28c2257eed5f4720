//! No request parser panics, whatever it is sent: arbitrary bytes, arbitrary JSON, and
//! real-shaped requests with arbitrary values in every field. Each answer is a normalized
//! request or a 400-class error.

use floe_gateway::protocol::{
    anthropic, gemini, openai_chat, openai_responses, Normalized, ProtocolError,
};
use proptest::prelude::*;
use serde_json::{json, Value};

type Parser = fn(&[u8]) -> Result<Normalized, ProtocolError>;

fn gemini_generate(body: &[u8]) -> Result<Normalized, ProtocolError> {
    gemini::normalize(body, "gemini-2.5-pro", false)
}
const PARSERS: [(&str, Parser); 4] = [
    ("openai_chat", openai_chat::normalize),
    ("anthropic", anthropic::normalize),
    ("openai_responses", openai_responses::normalize),
    ("gemini", gemini_generate),
];

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "developer",
            "tool",
            "text",
            "tool_use",
            "tool_result",
            "function_call",
            "function_call_output",
            "message",
            "image",
            "input_text",
            "custom",
            "namespace",
            "auto"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "role",
                    "content",
                    "type",
                    "text",
                    "messages",
                    "input",
                    "tools",
                    "name",
                    "id",
                    "call_id",
                    "tool_use_id",
                    "arguments",
                    "max_tokens",
                    "stream",
                    "system",
                    "tool_calls",
                    "source",
                    "model"
                ]),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn check(name: &str, parser: Parser, body: &[u8]) -> Result<(), TestCaseError> {
    match parser(body) {
        Ok(n) => prop_assert!(
            n.request.get("messages").is_some_and(Value::is_array),
            "{name}: no messages"
        ),
        Err(e) => prop_assert!(matches!(e.status(), 400 | 413), "{name}: {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        for (name, parser) in PARSERS {
            check(name, parser, &body)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics(value in any_json()) {
        let body = value.to_string();
        for (name, parser) in PARSERS {
            check(name, parser, body.as_bytes())?;
        }
    }

    #[test]
    fn real_shapes_with_arbitrary_parts_never_panic(messages in prop::collection::vec(any_json(), 0..5), tools in any_json(), extra in any_json()) {
        let bodies = [
            json!({"model": "m", "messages": messages, "tools": tools, "tool_choice": extra}),
            json!({"model": "m", "max_tokens": 16, "system": extra, "messages": messages, "tools": tools}),
            json!({"model": "m", "instructions": "x", "input": messages, "tools": tools, "text": extra}),
            json!({"systemInstruction": extra, "contents": messages, "tools": tools, "generationConfig": extra}),
        ];
        for body in &bodies {
            for (name, parser) in PARSERS {
                check(name, parser, body.to_string().as_bytes())?;
            }
        }
    }
}
