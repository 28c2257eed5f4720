//! Reading one upstream answer (sans-IO), straight from its text, in two passes:
//! - the token-level facts for the capture, into typed fields ([`Sampled`]);
//! - the answer for the reply, as a `Value` without the capture fields.
//!
//! The capture fields are the bulk of an answer: the prompt's token ids alone are thousands of
//! numbers. Parsed into a `Value` (a 32-byte node per number, then dropped) they were the
//! largest single cost of a call in the gateway; as `Vec<u32>` they are one allocation, and the
//! reply never holds them.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::upstream::UpstreamKind;
use super::ProtocolError;

/// Top-level fields of an answer that only the capture reads (vLLM's and SGLang's).
pub const CAPTURE_FIELDS: [&str; 4] = [
    "prompt_token_ids",
    "prompt_logprobs",
    "kv_transfer_params",
    "sglext",
];
/// Fields of a choice that only the capture reads.
pub const CHOICE_CAPTURE_FIELDS: [&str; 4] = [
    "token_ids",
    "prompt_token_ids",
    "meta_info",
    "hidden_states",
];

/// The token-level facts of one upstream answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub logprobs: Option<Vec<f64>>,
    pub finish_reason: Option<String>,
    pub model: String,
    /// A tool call whose arguments are not a JSON object (returned to the harness as text).
    pub unparsed_tool_call: bool,
    /// The weights that sampled, when the server says (SGLang's numeric `weight_version`).
    pub policy_version: Option<u64>,
}

/// One answer, read: what the capture records, and what the reply is made of.
#[derive(Debug)]
pub struct Answer {
    pub sampled: Sampled,
    /// The answer without [`CAPTURE_FIELDS`] and [`CHOICE_CAPTURE_FIELDS`]; the choices keep
    /// their `logprobs` only when the client asked for them.
    pub reply: Value,
}

/// Read a Chat Completions answer of an upstream of `kind`.
pub fn read_answer(
    text: &str,
    kind: UpstreamKind,
    keep_logprobs: bool,
) -> Result<Answer, ProtocolError> {
    let malformed = |e: serde_json::Error| {
        ProtocolError::Upstream(format!("answer is not a Chat Completions answer: {e}"))
    };
    let tokens: Tokens = serde_json::from_str(text).map_err(malformed)?;
    let reply = Skipping::answer(keep_logprobs)
        .deserialize(&mut serde_json::Deserializer::from_str(text))
        .map_err(malformed)?;
    let sampled = sampled(tokens, &reply, kind)?;
    Ok(Answer { sampled, reply })
}

fn sampled(tokens: Tokens, reply: &Value, kind: UpstreamKind) -> Result<Sampled, ProtocolError> {
    let bad = |what: &str| {
        ProtocolError::Upstream(match kind {
            UpstreamKind::Vllm => {
                format!("response without {what}: is the upstream vLLM with return_token_ids?")
            }
            UpstreamKind::Sglang => format!(
                "response without {what}: is the upstream SGLang with return_prompt_token_ids and return_meta_info?"
            ),
        })
    };
    let choice = tokens
        .choices
        .and_then(|c| c.into_iter().next())
        .ok_or_else(|| bad("choices"))?;
    let openai_logprobs = choice
        .logprobs
        .and_then(|l| l.content)
        .and_then(|items| items.into_iter().map(|i| i.logprob).collect());
    let (prompt_token_ids, token_ids, logprobs, policy_version) = match kind {
        UpstreamKind::Vllm => (
            tokens
                .prompt_token_ids
                .ok_or_else(|| bad("prompt_token_ids"))?,
            choice
                .token_ids
                .ok_or_else(|| bad("choices[0].token_ids"))?,
            openai_logprobs,
            None,
        ),
        UpstreamKind::Sglang => {
            let prompt = choice
                .prompt_token_ids
                .ok_or_else(|| bad("choices[0].prompt_token_ids"))?;
            let meta = choice.meta_info.unwrap_or_default();
            // The sampled ids and their logprobs come as pairs, so they always line up.
            let (ids, lps): (Vec<u32>, Vec<f64>) = meta
                .output_token_logprobs
                .and_then(|pairs| pairs.into_iter().map(|p| p.0).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad("choices[0].meta_info.output_token_logprobs"))?
                .into_iter()
                .unzip();
            let version = match meta.weight_version {
                Some(Value::String(v)) => v.parse().ok(),
                Some(v) => v.as_u64(),
                None => None,
            };
            (prompt, ids, Some(lps), version)
        }
    };
    let logprobs = logprobs.filter(|lp: &Vec<f64>| lp.len() == token_ids.len());
    let choice = &reply["choices"][0];
    let unparsed_tool_call = choice["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| super::call_arguments(c).is_none());
    Ok(Sampled {
        unparsed_tool_call,
        prompt_token_ids,
        token_ids,
        logprobs,
        policy_version,
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
        model: reply["model"].as_str().unwrap_or_default().to_string(),
    })
}

/// The capture's view of an answer: every other field is skipped unread.
#[derive(Deserialize)]
struct Tokens {
    #[serde(default)]
    prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    choices: Option<Vec<ChoiceTokens>>,
}

#[derive(Deserialize)]
struct ChoiceTokens {
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    prompt_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<LogprobsTokens>,
    #[serde(default)]
    meta_info: Option<MetaTokens>,
}

#[derive(Deserialize)]
struct LogprobsTokens {
    #[serde(default)]
    content: Option<Vec<LogprobToken>>,
}

#[derive(Deserialize)]
struct LogprobToken {
    #[serde(default)]
    logprob: Option<f64>,
}

#[derive(Default, Deserialize)]
struct MetaTokens {
    #[serde(default)]
    output_token_logprobs: Option<Vec<SglangToken>>,
    #[serde(default)]
    weight_version: Option<Value>,
}

/// One `[logprob, token id, text]` of SGLang's `output_token_logprobs`; `None` when its first
/// two entries are not a number and a token id.
struct SglangToken(Option<(u32, f64)>);

impl<'de> Deserialize<'de> for SglangToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SglangTokenVisitor)
    }
}

struct SglangTokenVisitor;

impl<'de> Visitor<'de> for SglangTokenVisitor {
    type Value = SglangToken;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("[logprob, token id, text]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SglangToken, A::Error> {
        let logprob: Option<Value> = seq.next_element()?;
        let id: Option<Value> = seq.next_element()?;
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        let pair = (|| {
            let id = u32::try_from(id?.as_u64()?).ok()?;
            Some((id, logprob?.as_f64()?))
        })();
        Ok(SglangToken(pair))
    }
}

/// A JSON object without the `skip` fields (and without `logprobs` unless kept); with
/// `choices`, its `choices` array's objects are read the same way with
/// [`CHOICE_CAPTURE_FIELDS`].
struct Skipping {
    skip: &'static [&'static str],
    keep_logprobs: bool,
    choices: bool,
}

impl Skipping {
    /// The whole answer.
    fn answer(keep_logprobs: bool) -> Self {
        Self {
            skip: &CAPTURE_FIELDS,
            keep_logprobs,
            choices: true,
        }
    }

    /// One of its choices.
    fn choice(keep_logprobs: bool) -> Self {
        Self {
            skip: &CHOICE_CAPTURE_FIELDS,
            keep_logprobs,
            choices: false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Skipping {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Skipping {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.skip.contains(&key.as_str())
                || (!self.choices && key == "logprobs" && !self.keep_logprobs)
            {
                map.next_value::<IgnoredAny>()?;
            } else if self.choices && key == "choices" {
                let choices = map.next_value_seed(Choices {
                    keep_logprobs: self.keep_logprobs,
                })?;
                out.insert(key, choices);
            } else {
                let value = map.next_value::<Value>()?;
                out.insert(key, value);
            }
        }
        Ok(Value::Object(out))
    }
}

/// The `choices` array (or `null`), each choice read by [`Skipping::choice`].
struct Choices {
    keep_logprobs: bool,
}

impl<'de> DeserializeSeed<'de> for Choices {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choices {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of choices")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(choice) = seq.next_element_seed(Skipping::choice(self.keep_logprobs))? {
            out.push(choice);
        }
        Ok(Value::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(answer: &Value, kind: UpstreamKind) -> Result<Sampled, ProtocolError> {
        read_answer(&answer.to_string(), kind, false).map(|a| a.sampled)
    }

    #[test]
    fn sampled_tokens_and_logprobs_are_read() {
        let resp = json!({"model": "policy", "prompt_token_ids": [1, 2], "choices": [{"finish_reason": "stop",
            "token_ids": [5, 2], "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.1}]}}]});
        let s = read(&resp, UpstreamKind::Vllm).expect("ok");
        assert_eq!(
            (s.prompt_token_ids, s.token_ids, s.logprobs),
            (vec![1, 2], vec![5, 2], Some(vec![-0.5, -0.1]))
        );
        let no_ids = json!({"choices": [{"finish_reason": "stop"}]});
        assert!(matches!(
            read(&no_ids, UpstreamKind::Vllm),
            Err(ProtocolError::Upstream(_))
        ));
    }

    /// An SGLang 0.5 answer, as its `ChatCompletionResponseChoice` serializes it.
    fn sglang_answer(meta: Value) -> Value {
        json!({"id": "c1", "object": "chat.completion", "model": "policy",
            "choices": [{"index": 0, "finish_reason": "stop", "matched_stop": 2,
                "message": {"role": "assistant", "content": "hi", "reasoning_content": null, "tool_calls": null},
                "logprobs": {"content": [{"token": "hi", "logprob": -0.25, "bytes": null, "top_logprobs": []},
                                         {"token": "", "logprob": -0.5, "bytes": null, "top_logprobs": []}]},
                "prompt_token_ids": [1, 2, 3],
                "meta_info": meta}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    }

    #[test]
    fn sglang_answers_are_read_from_the_choice_and_its_meta_info() {
        let resp = sglang_answer(
            json!({"id": "r1", "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 3, "completion_tokens": 2, "weight_version": "7",
            "output_token_logprobs": [[-0.25, 5, null], [-0.5, 2, null]]}),
        );
        let s = read(&resp, UpstreamKind::Sglang).expect("ok");
        assert_eq!(
            (
                s.prompt_token_ids,
                s.token_ids,
                s.logprobs,
                s.policy_version,
                s.finish_reason.as_deref()
            ),
            (
                vec![1, 2, 3],
                vec![5, 2],
                Some(vec![-0.25, -0.5]),
                Some(7),
                Some("stop")
            )
        );
        // SGLang's default weight version is not a number: no policy version.
        let resp = sglang_answer(json!({"weight_version": "default",
            "output_token_logprobs": [[-0.25, 5, null]]}));
        assert_eq!(
            read(&resp, UpstreamKind::Sglang)
                .expect("ok")
                .policy_version,
            None
        );
        // Without meta_info (return_meta_info ignored by an old server): a clear error.
        let resp = sglang_answer(Value::Null);
        let err = read(&resp, UpstreamKind::Sglang).expect_err("no meta_info");
        assert!(err.to_string().contains("return_meta_info"), "{err}");
        // A vLLM answer read as SGLang's (a misconfigured gateway) says so too.
        let vllm = json!({"prompt_token_ids": [1], "choices": [{"token_ids": [2]}]});
        assert!(read(&vllm, UpstreamKind::Sglang).is_err());
    }

    #[test]
    fn the_reply_holds_the_answer_without_its_capture_fields() {
        let answer = json!({"id": "c1", "model": "policy", "prompt_token_ids": [1, 2], "prompt_logprobs": null,
            "kv_transfer_params": null, "usage": {"prompt_tokens": 2},
            "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [5],
                "logprobs": {"content": [{"token": "x", "logprob": -0.5}]},
                "message": {"role": "assistant", "content": null,
                    "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}}]});
        let read = read_answer(&answer.to_string(), UpstreamKind::Vllm, false).expect("ok");
        let mut expected = answer.clone();
        for field in ["prompt_token_ids", "prompt_logprobs", "kv_transfer_params"] {
            expected.as_object_mut().map(|o| o.remove(field));
        }
        for field in ["token_ids", "logprobs"] {
            expected["choices"][0]
                .as_object_mut()
                .map(|o| o.remove(field));
        }
        assert_eq!(read.reply, expected);
        assert!(read.sampled.unparsed_tool_call);
        assert_eq!(read.sampled.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(read.sampled.logprobs, Some(vec![-0.5]));
        // The client asked for logprobs: its reply keeps them.
        let kept = read_answer(&answer.to_string(), UpstreamKind::Vllm, true).expect("ok");
        assert_eq!(
            kept.reply["choices"][0]["logprobs"],
            answer["choices"][0]["logprobs"]
        );
    }

    #[test]
    fn malformed_answers_are_upstream_errors() {
        for text in [
            "",
            "[1]",
            "{\"choices\": 3}",
            "{\"choices\": [7]}",
            "{\"prompt_token_ids\": [-1]}",
            "{\"prompt_token_ids\": [1], \"choices\": [{\"token_ids\": [4294967296]}]}",
        ] {
            for kind in [UpstreamKind::Vllm, UpstreamKind::Sglang] {
                assert!(
                    matches!(
                        read_answer(text, kind, false),
                        Err(ProtocolError::Upstream(_))
                    ),
                    "{text}"
                );
            }
        }
        // No choices at all, or null: named as missing.
        let err = read_answer("{\"choices\": null}", UpstreamKind::Vllm, false).expect_err("null");
        assert!(err.to_string().contains("without choices"), "{err}");
    }
}
