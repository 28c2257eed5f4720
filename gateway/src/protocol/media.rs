//! Media in a call must travel inline (sans-IO). A part that names its image, video, audio or
//! file by a remote URL would have the model server fetch it: from the host in local mode, from
//! the trainer pod in a cluster, past every rule of the agent's sandbox network (row 7 of
//! docs/security.md). The query string of such a URL carries whatever the agent wants out, and
//! a vision model's server is an open fetcher on the agent's behalf. So the gateway refuses
//! anything but `data:` URLs, whatever the job, with a 400 in the caller's own shape. Every
//! harness sends images inline (base64) already.
//!
//! In a train job even inline media cannot stay: the trainer conditions on token ids alone, so
//! an image the model server saw would be missing from what it trains on, and every token
//! sampled after it would get its log-prob and gradient under another context than it was
//! sampled in. Such a part becomes a short text note ([`TEXT_ONLY_NOTE`]), which the server
//! and the trainer then see alike, and the agent learns it was not shown ([`to_text`]). A
//! token count takes the same path, so it counts what the call will send.

use serde_json::{Map, Value};

/// The parts of a Chat Completions content list that name media by URL, and where the URL is.
const MEDIA: &[(&str, &str)] = &[
    ("image_url", "url"),
    ("video_url", "url"),
    ("audio_url", "url"),
    ("file", "file_data"),
];

/// What an image in a tool result becomes, in every job: a Chat Completions tool message holds
/// text only, and the agent is told rather than handed an empty result.
pub const TOOL_RESULT_IMAGE_NOTE: &str =
    "[image omitted: an image in a tool result is not passed to the model]";

/// The same for any other file in a tool result (Claude Code answers a Read of a PDF with a
/// `document` block; Gemini CLI puts a read file in its `functionResponse.parts`).
pub const TOOL_RESULT_FILE_NOTE: &str =
    "[file omitted: a file in a tool result is not passed to the model]";

/// A document the user attached, which no Chat Completions message can carry.
pub const DOCUMENT_NOTE: &str = "[document omitted: a document is not passed to the model]";

/// What a media part of a train job's call becomes.
pub const TEXT_ONLY_NOTE: &str =
    "[media omitted: this model is being trained on text only, so it is not shown media]";

/// Replace every media part of `body`'s messages (`image_url` and the others, `input_audio`,
/// vLLM's `image_embeds` and `audio_embeds`) by a text part holding [`TEXT_ONLY_NOTE`];
/// `replace` false only looks. Returns the kinds found, in order of first appearance. (A part
/// naming a remote URL is refused before this: [`remote_media`].)
pub fn to_text(body: &mut Map<String, Value>, replace: bool) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return kinds;
    };
    let parts = messages
        .iter_mut()
        .filter_map(|m| m.get_mut("content").and_then(Value::as_array_mut))
        .flatten();
    for part in parts {
        let kind = MEDIA
            .iter()
            .map(|(kind, _)| *kind)
            .chain(["input_audio", "image_embeds", "audio_embeds"])
            .find(|kind| part.get(*kind).is_some());
        let Some(kind) = kind else {
            continue;
        };
        if !kinds.iter().any(|k| k == kind) {
            kinds.push(kind.to_string());
        }
        if replace {
            *part = serde_json::json!({"type": "text", "text": TEXT_ONLY_NOTE});
        }
    }
    kinds
}

/// Where `body` names media by anything but a `data:` URL (`messages[i].content[j]`), and its
/// scheme; `None` when every media part is inline.
pub fn remote_media(body: &Map<String, Value>) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    for (i, message) in messages.iter().enumerate() {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (j, part) in parts.iter().enumerate() {
            for (kind, key) in MEDIA {
                let Some(media) = part.get(*kind) else {
                    continue;
                };
                // `image_url` may be the URL itself or an object holding it.
                let url = media.as_str().or_else(|| media.get(*key)?.as_str());
                if let Some(url) = url.filter(|u| !is_inline(u)) {
                    let scheme = url.split_once(':').map_or("a relative", |(s, _)| s);
                    return Some(format!(
                        "messages[{i}].content[{j}].{kind}: media must be inline (a data: URL), \
                         not a {scheme} URL the model server would fetch for the agent"
                    ));
                }
            }
        }
    }
    None
}

fn is_inline(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|head| head.eq_ignore_ascii_case("data:"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(content: Value) -> Map<String, Value> {
        let v = json!({"messages": [{"role": "system", "content": "s"},
                                    {"role": "user", "content": content}]});
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn inline_media_and_text_pass() {
        let inline = json!([
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": "DATA:image/png;base64,AAAA"},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        ]);
        assert_eq!(remote_media(&body(inline)), None);
        assert_eq!(remote_media(&body(json!("plain text"))), None);
    }

    #[test]
    fn a_train_calls_media_become_a_text_note_and_are_named() {
        let mut b = body(json!([
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "image_url", "image_url": "data:image/png;base64,BBBB"},
            {"type": "image_embeds", "image_embeds": "AAAA"},
        ]));
        let before = b.clone();
        let kinds = ["image_url", "input_audio", "image_embeds"];
        assert_eq!(to_text(&mut b, false), kinds);
        assert_eq!(b, before, "looking changes nothing");
        assert_eq!(to_text(&mut b, true), kinds);
        let parts = &b["messages"][1]["content"];
        assert_eq!(parts[0], json!({"type": "text", "text": "look"}));
        for i in 1..5 {
            assert_eq!(parts[i]["text"], TEXT_ONLY_NOTE, "{parts}");
        }
        assert!(to_text(&mut b, true).is_empty(), "nothing left");
        assert!(to_text(&mut body(json!("plain")), true).is_empty());
    }

    #[test]
    fn a_url_the_server_would_fetch_is_named() {
        for (part, kind, scheme) in [
            (
                json!({"type": "image_url", "image_url": {"url": "http://10.0.0.1/x?k=secret"}}),
                "image_url",
                "http",
            ),
            (
                json!({"type": "image_url", "image_url": "https://example.invalid/a.png"}),
                "image_url",
                "https",
            ),
            (
                json!({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}),
                "video_url",
                "file",
            ),
            (
                json!({"type": "audio_url", "audio_url": {"url": "ftp://h/a.wav"}}),
                "audio_url",
                "ftp",
            ),
            (
                json!({"type": "file", "file": {"file_data": "http://h/f.pdf"}}),
                "file",
                "http",
            ),
        ] {
            let said = remote_media(&body(json!([{"type": "text", "text": "t"}, part])));
            let said = said.unwrap_or_default();
            assert!(
                said.starts_with(&format!("messages[1].content[1].{kind}:")),
                "{said}"
            );
            assert!(said.contains(&format!("not a {scheme} URL")), "{said}");
        }
    }
}
