//! Builder behaviour on hand-made sessions: one test per chain-start reason and edge case.

use super::*;
use crate::capture::CompletionRecord;

const EOT: u32 = 9;

/// A call at time `seq`; each sampled token's logprob encodes (seq, position) so tests can tell
/// whose logprob ended up where.
fn rec(seq: u64, prompt: &[u32], response: &[u32], finish: &str) -> CompletionRecord {
    CompletionRecord {
        started_at_ms: 1000 + seq,
        finished_at_ms: 1000 + seq,
        policy_version: Some(seq / 2),
        logprobs: Some((0..response.len()).map(|i| lp(seq, i)).collect()),
        finish_reason: Some(finish.into()),
        session: "s".into(),
        ..CompletionRecord::from_tokens(seq, prompt.to_vec(), response.to_vec())
    }
}

fn lp(seq: u64, i: usize) -> f64 {
    -((seq * 100 + i as u64) as f64) / 1000.0
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

fn merge(records: &[CompletionRecord]) -> (Vec<Trace>, ReconstructionStats) {
    let options = BuildOptions {
        builder: Builder::PrefixMerging,
        end_of_turn: Some(EOT),
        max_length: None,
        ..Default::default()
    };
    build_traces(records, &options)
}

fn starts(traces: &[Trace]) -> Vec<ChainStart> {
    traces.iter().map(|t| t.start).collect()
}

#[test]
fn a_multi_turn_conversation_becomes_one_trace() {
    let p0 = [1, 2, 3];
    let r0 = [10, 11, EOT];
    let p1 = cat(&[&p0, &r0, &[20, 21]]); // + tool result
    let r1 = [12, EOT];
    let p2 = cat(&[&p1, &r1, &[22]]);
    let r2 = [13, EOT];
    let (traces, stats) = merge(&[
        rec(0, &p0, &r0, "tool_calls"),
        rec(1, &p1, &r1, "tool_calls"),
        rec(2, &p2, &r2, "stop"),
    ]);
    assert_eq!(traces.len(), 1);
    let t = &traces[0];
    assert_eq!(t.prompt_token_ids, p0);
    assert_eq!(
        t.response_token_ids,
        [10, 11, EOT, 20, 21, 12, EOT, 22, 13, EOT]
    );
    assert_eq!(t.loss_mask, [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]);
    let expected_lp = [
        Some(lp(0, 0)),
        Some(lp(0, 1)),
        Some(lp(0, 2)),
        None,
        None,
        Some(lp(1, 0)),
        Some(lp(1, 1)),
        None,
        Some(lp(2, 0)),
        Some(lp(2, 1)),
    ];
    assert_eq!(t.logprobs, expected_lp);
    assert_eq!(t.completions, [0, 1, 2]);
    assert_eq!(t.start, ChainStart::First);
    assert_eq!(t.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        (
            stats.traces,
            stats.breaks,
            stats.sampled_tokens,
            stats.trainable_tokens
        ),
        (1, 0, 7, 7)
    );
    assert_eq!(stats.total_tokens, 13);
}

#[test]
fn a_truncated_turn_merges_with_the_template_closing_it_unmasked() {
    let p0 = [1, 2];
    let r0 = [10, 11]; // cut by max_tokens: no end-of-turn sampled
    let p1 = cat(&[&p0, &r0, &[EOT, 20]]);
    let (traces, stats) = merge(&[rec(0, &p0, &r0, "length"), rec(1, &p1, &[12, EOT], "stop")]);
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0].loss_mask, [1, 1, 0, 0, 1, 1]);
    assert_eq!((stats.truncated_turns, stats.overlong_turns), (1, 1));
}

#[test]
fn a_length_stop_at_a_short_cap_the_caller_asked_for_is_not_overlong() {
    // Claude Code's one-token checks stop at `length` by design; the job's cap cut the other.
    let checked = CompletionRecord {
        short_cap: true,
        ..rec(0, &[1, 2], &[10], "length")
    };
    let (_, stats) = merge(&[checked, rec(1, &[3, 4], &[11, 12], "length")]);
    assert_eq!((stats.truncated_turns, stats.overlong_turns), (2, 1));
    assert_eq!(
        stats.longest_turn_tokens, 2,
        "the job's call, not the short one"
    );
    let long_short = CompletionRecord {
        short_cap: true,
        ..rec(0, &[1, 2], &[10, 11, 12, 13], "stop")
    };
    let (_, stats) = merge(&[long_short, rec(1, &[3, 4], &[11, 12, 13], "stop")]);
    assert_eq!(
        stats.longest_turn_tokens, 3,
        "a short cap's call never measures the session's length"
    );
    let (_, stats) = build_traces(
        &[rec(0, &[1, 2], &[10], "length")],
        &BuildOptions {
            builder: Builder::PerRequest,
            end_of_turn: Some(EOT),
            max_length: None,
            ..Default::default()
        },
    );
    assert_eq!(stats.overlong_turns, 1);
    // A tool call that ran to the cap: vLLM says `tool_calls`, the whole cap was sampled.
    let cut = CompletionRecord {
        normalized_request: serde_json::json!({"max_tokens": 2}),
        ..rec(0, &[1, 2], &[10, 11], "tool_calls")
    };
    let short = CompletionRecord {
        normalized_request: serde_json::json!({"max_tokens": 3}),
        ..rec(1, &[3], &[12], "tool_calls")
    };
    let (_, stats) = merge(&[cut, short]);
    assert_eq!((stats.truncated_turns, stats.overlong_turns), (0, 1));
}

#[test]
fn an_end_of_turn_the_server_did_not_report_is_found_in_the_next_prompt() {
    let p0 = [1, 2];
    let r0 = [10, 11]; // stopped on EOS, which this server leaves out of the token ids
    let p1 = cat(&[&p0, &r0, &[EOT, 20]]);
    let (traces, _) = merge(&[rec(0, &p0, &r0, "stop"), rec(1, &p1, &[12], "stop")]);
    assert_eq!(starts(&traces), [ChainStart::First]);
    // The end-of-turn token was not reported as sampled, so it is context (mask 0), not trained.
    assert_eq!(traces[0].loss_mask, [1, 1, 0, 0, 1]);
}

#[test]
fn no_end_of_turn_breaks_the_chain() {
    let p0 = [1, 2];
    let r0 = [10, 11];
    let p1 = cat(&[&p0, &r0, &[20]]);
    let (traces, stats) = merge(&[rec(0, &p0, &r0, "stop"), rec(1, &p1, &[12, EOT], "stop")]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::NoEndOfTurn]
    );
    assert_eq!(stats.breaks, 1);
    assert_eq!(traces[1].prompt_token_ids, p1);
}

#[test]
fn a_rewritten_previous_turn_breaks_the_chain_instead_of_training_on_unseen_context() {
    let p0 = [1, 2];
    let r0 = [30, 31, 10, EOT]; // <think>…</think> answer
    let p1 = cat(&[&p0, &[10, EOT], &[20]]); // the chat template stripped the thinking
    let (traces, stats) = merge(&[rec(0, &p0, &r0, "stop"), rec(1, &p1, &[12, EOT], "stop")]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::TemplateRewrite]
    );
    assert_eq!(stats.starts.get(&ChainStart::TemplateRewrite), Some(&1));
    // Both turns are still there, each in its own trace.
    assert_eq!(traces[0].response_token_ids, r0);
    assert_eq!(traces[1].response_token_ids, [12, EOT]);
}

#[test]
fn compaction_breaks_the_chain_and_keeps_both_parts() {
    let p0 = [1, 2, 3];
    let r0 = [10, EOT];
    let p1 = cat(&[&p0, &r0, &[20]]);
    let r1 = [11, EOT];
    let compacted = cat(&[&p0, &[77, 78]]); // first prompt kept, history replaced by a summary
    let p3 = cat(&[&compacted, &[12, EOT], &[21]]);
    let (traces, stats) = merge(&[
        rec(0, &p0, &r0, "stop"),
        rec(1, &p1, &r1, "stop"),
        rec(2, &compacted, &[12, EOT], "stop"),
        rec(3, &p3, &[13, EOT], "stop"),
    ]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::PrefixChanged]
    );
    assert_eq!(traces[0].completions, [0, 1]);
    assert_eq!(traces[1].completions, [2, 3]);
    assert_eq!(stats.breaks, 1);
}

#[test]
fn interleaved_sub_agents_and_background_calls_fall_into_separate_chains() {
    let sys = [1, 2];
    let main0 = cat(&[&sys, &[3]]);
    let sub0 = cat(&[&sys, &[4]]); // a sub-agent with its own task
    let title = [50, 51]; // a background title request
    let main1 = cat(&[&main0, &[10, EOT], &[20]]);
    let sub1 = cat(&[&sub0, &[11, EOT], &[21]]);
    let main2 = cat(&[&main1, &[12, EOT], &[22]]);
    let (traces, stats) = merge(&[
        rec(0, &main0, &[10, EOT], "tool_calls"),
        rec(1, &sub0, &[11, EOT], "tool_calls"),
        rec(2, &title, &[60, EOT], "stop"),
        rec(3, &main1, &[12, EOT], "tool_calls"),
        rec(4, &sub1, &[13, EOT], "stop"),
        rec(5, &main2, &[14, EOT], "stop"),
    ]);
    assert_eq!(
        starts(&traces),
        [
            ChainStart::First,
            ChainStart::NewContext,
            ChainStart::NewContext
        ]
    );
    assert_eq!(traces[0].completions, [0, 3, 5]);
    assert_eq!(traces[1].completions, [1, 4]);
    assert_eq!(traces[2].completions, [2]);
    assert_eq!(stats.breaks, 0);
}

#[test]
fn retries_and_parallel_branches_are_forks_not_breaks() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let branch = cat(&[&p0, &[10, EOT], &[21]]); // another tool result after turn 0
    let p2 = cat(&[&p1, &[12, EOT], &[22]]);
    let (traces, stats) = merge(&[
        rec(0, &p0, &[10, EOT], "stop"),
        rec(1, &p0, &[11, EOT], "stop"), // same prompt again: another sample
        rec(2, &p1, &[12, EOT], "stop"),
        rec(3, &branch, &[13, EOT], "stop"),
        rec(4, &p2, &[14, EOT], "stop"), // the original branch goes on: both are alive
    ]);
    // seq 2 extends seq 0's chain, not its sibling seq 1 whose sample p1 does not hold.
    assert_eq!(traces[0].completions, [0, 2, 4]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::Fork, ChainStart::Fork]
    );
    assert_eq!(stats.breaks, 0);
}

/// A harness that gave up waiting on a long generation asks again with the same prompt: the
/// reply it never saw is no fork of the session, and no sample of either builder.
#[test]
fn a_reply_nobody_saw_is_left_out_and_counted() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[11, EOT], &[20]]);
    let given_up = CompletionRecord {
        abandoned: true,
        policy_version: Some(7),
        ..rec(0, &p0, &[10, 10, 10, 10], "length")
    };
    let records = [
        given_up,
        rec(1, &p0, &[11, EOT], "tool_calls"),
        rec(2, &p1, &[12, EOT], "stop"),
    ];
    let (traces, stats) = merge(&records);
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0].completions, [1, 2]);
    assert_eq!(starts(&traces), [ChainStart::First]);
    assert_eq!((stats.completions, stats.sampled_tokens), (2, 4));
    assert_eq!((stats.abandoned_calls, stats.abandoned_tokens), (1, 4));
    assert_eq!(
        (stats.truncated_turns, stats.longest_turn_tokens),
        (0, 2),
        "its length is not the session's"
    );
    let options = BuildOptions {
        builder: Builder::PerRequest,
        ..Default::default()
    };
    let (traces, stats) = build_traces(&records, &options);
    assert_eq!(traces.len(), 2);
    assert!(traces.iter().all(|t| t.completions != [0]));
    assert_eq!(stats.abandoned_calls, 1);
    let t = build_trajectory(&session(), &records, &options, &passed());
    assert_eq!(
        t.policy_versions,
        [0, 1],
        "the version only the left-out call had is not listed"
    );
    let wire = serde_json::to_value(&t.stats).unwrap_or_default();
    assert_eq!(wire["abandoned_calls"], 1);
    let none = build_trajectory(&session(), &two_turns(), &options, &passed());
    let wire = serde_json::to_value(&none.stats).unwrap_or_default();
    assert!(
        wire.get("abandoned_calls").is_none(),
        "omitted when none: {wire}"
    );
}

/// Claude Code says what each call is for: the trajectory counts its calls by that, its
/// abandoned ones aside, so a run shows how much of what it trains is compaction or a subagent.
#[test]
fn calls_are_counted_by_the_class_the_harness_gave_them() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[11, EOT], &[20]]);
    let class = |c: &str, r: CompletionRecord| CompletionRecord {
        request_class: Some(c.into()),
        ..r
    };
    let records = [
        class("main", rec(0, &p0, &[11, EOT], "tool_calls")),
        class("main", rec(1, &p1, &[12, EOT], "stop")),
        class("compaction", rec(2, &[7, 8], &[9, EOT], "stop")),
        CompletionRecord {
            abandoned: true,
            ..class("subagent", rec(3, &[5], &[6], "stop"))
        },
        rec(4, &[3], &[4, EOT], "stop"),
    ];
    for builder in [Builder::PrefixMerging, Builder::PerRequest] {
        let options = BuildOptions {
            builder,
            ..Default::default()
        };
        let (_, stats) = build_traces(&records, &options);
        let counted: Vec<(&str, u64)> = stats
            .calls_by_class
            .iter()
            .map(|(c, n)| (c.as_str(), *n))
            .collect();
        assert_eq!(counted, [("compaction", 1), ("main", 2)], "{builder:?}");
    }
    let wire = serde_json::to_value(&merge(&two_turns()).1).unwrap_or_default();
    assert!(
        wire.get("calls_by_class").is_none(),
        "omitted when no call said: {wire}"
    );
    // A forged header per call cannot grow the count past its bound, nor push Claude Code's
    // own classes into `other`.
    let mut forged: Vec<CompletionRecord> = (0..20)
        .map(|i| class(&format!("c{i:02}"), rec(i, &[1], &[2, EOT], "stop")))
        .collect();
    forged.push(class("main", rec(20, &[1], &[2, EOT], "stop")));
    let (_, stats) = merge(&forged);
    let unknown = MAX_UNKNOWN_REQUEST_CLASSES as u64;
    assert_eq!(stats.calls_by_class.len() as u64, unknown + 2);
    assert_eq!(stats.calls_by_class[OTHER_CLASSES], 20 - unknown);
    assert_eq!(
        (stats.calls_by_class["c00"], stats.calls_by_class["main"]),
        (1, 1)
    );
}

/// A job may leave out the calls of some request classes (`trajectory.excludeRequestClasses`):
/// they are in no trace and no count but their own and the count by class, the agent's own
/// turns around them still merge, and a policy version only they had is not listed.
#[test]
fn calls_of_an_excluded_class_are_left_out_of_the_traces_and_counted() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[11, EOT], &[20]]);
    let class = |c: &str, r: CompletionRecord| CompletionRecord {
        request_class: Some(c.into()),
        ..r
    };
    let side = CompletionRecord {
        policy_version: Some(9),
        ..class("auxiliary", rec(1, &[7, 8], &[30, 31, 32, EOT], "length"))
    };
    let records = [
        class("main", rec(0, &p0, &[11, EOT], "tool_calls")),
        side,
        class("main", rec(2, &p1, &[12, EOT], "stop")),
        rec(3, &[3], &[4, EOT], "stop"),
    ];
    let excluding = |builder| BuildOptions {
        builder,
        end_of_turn: Some(EOT),
        exclude_classes: vec!["auxiliary".into(), "compaction".into()],
        ..Default::default()
    };
    let (traces, stats) = build_traces(&records, &excluding(Builder::PrefixMerging));
    let calls: Vec<&[u64]> = traces.iter().map(|t| t.completions.as_slice()).collect();
    assert_eq!(calls, [&[0, 2][..], &[3]], "the main turns merge around it");
    assert_eq!((stats.completions, stats.sampled_tokens), (3, 6));
    assert_eq!((stats.excluded_calls, stats.excluded_tokens), (1, 4));
    assert_eq!(
        (
            stats.truncated_turns,
            stats.overlong_turns,
            stats.longest_turn_tokens
        ),
        (0, 0, 2),
        "its cut is not the policy's turn"
    );
    let counted: Vec<(&str, u64)> = stats
        .calls_by_class
        .iter()
        .map(|(c, n)| (c.as_str(), *n))
        .collect();
    assert_eq!(counted, [("auxiliary", 1), ("main", 2)]);
    let (traces, stats) = build_traces(&records, &excluding(Builder::PerRequest));
    assert!(traces.iter().all(|t| t.completions != [1]));
    assert_eq!((traces.len(), stats.excluded_calls), (3, 1));
    let t = build_trajectory(
        &session(),
        &records,
        &excluding(Builder::PerRequest),
        &passed(),
    );
    assert_eq!(
        t.policy_versions,
        [0, 1],
        "version 9 sampled only the side call"
    );
    let wire = serde_json::to_value(&t.stats).unwrap_or_default();
    assert_eq!(
        (
            wire["excluded_calls"].as_u64(),
            wire["excluded_tokens"].as_u64()
        ),
        (Some(1), Some(4))
    );
    // Nothing excluded: every call is trained, and the counts are not on the wire.
    let (traces, stats) = merge(&records);
    assert_eq!(traces.iter().map(|t| t.completions.len()).sum::<usize>(), 4);
    assert_eq!(stats.excluded_calls, 0);
    let wire = serde_json::to_value(&stats).unwrap_or_default();
    assert!(wire.get("excluded_calls").is_none(), "{wire}");
}

#[test]
fn a_branch_whose_parent_never_continues_is_a_history_rewrite() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let rewritten = cat(&[&p0, &[10, EOT], &[20], &[55, 56]]); // turn 1 dropped, summary instead
    let (traces, stats) = merge(&[
        rec(0, &p0, &[10, EOT], "stop"),
        rec(1, &p1, &[12, EOT], "stop"),
        rec(2, &rewritten, &[13, EOT], "stop"),
    ]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::PrefixChanged]
    );
    assert_eq!(stats.breaks, 1);
}

#[test]
fn a_retokenized_last_turn_deep_in_a_chain_is_a_template_rewrite() {
    // Seen on vLLM + SmolLM2: "capsettages" sampled as [40, 41], re-rendered as [42, 43].
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let p2 = cat(&[&p1, &[30, 31, 42, 43, 32, 33, EOT], &[21]]);
    let (traces, _) = merge(&[
        rec(0, &p0, &[10, EOT], "stop"),
        rec(1, &p1, &[30, 31, 40, 41, 32, 33, EOT], "stop"),
        rec(2, &p2, &[14, EOT], "stop"),
    ]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::TemplateRewrite]
    );
    assert_eq!(traces[0].completions, [0, 1]);
}

#[test]
fn missing_logprobs_break_the_chain_and_stay_explicitly_unknown() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let mut second = rec(1, &p1, &[12, EOT], "stop");
    second.logprobs = None;
    let (traces, stats) = merge(&[rec(0, &p0, &[10, EOT], "stop"), second]);
    assert_eq!(
        starts(&traces),
        [ChainStart::First, ChainStart::MissingLogprobs]
    );
    assert_eq!(traces[1].logprobs, [None, None]);
    assert_eq!(traces[1].loss_mask, [1, 1]);
    assert_eq!(stats.tokens_missing_logprobs, 2);
}

#[test]
fn max_length_breaks_the_chain() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20, 21, 22]]);
    let options = BuildOptions {
        builder: Builder::PrefixMerging,
        end_of_turn: Some(EOT),
        max_length: Some(8),
        ..Default::default()
    };
    let (traces, _) = build_traces(
        &[
            rec(0, &p0, &[10, EOT], "stop"),
            rec(1, &p1, &[12, 13, EOT], "stop"),
        ],
        &options,
    );
    assert_eq!(starts(&traces), [ChainStart::First, ChainStart::MaxLength]);
}

#[test]
fn records_are_ordered_by_time_not_file_order() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let (traces, _) = merge(&[
        rec(1, &p1, &[12, EOT], "stop"),
        rec(0, &p0, &[10, EOT], "stop"),
    ]);
    assert_eq!(traces.len(), 1);
    assert_eq!(traces[0].completions, [0, 1]);
}

#[test]
fn end_of_turn_is_inferred_from_calls_that_stopped() {
    let records = [
        rec(0, &[1], &[10, EOT], "stop"),
        rec(1, &[1], &[11, EOT], "tool_calls"),
        rec(2, &[1], &[12, 13], "length"),
        rec(3, &[1], &[14, 15], "stop"),
    ];
    assert_eq!(infer_end_of_turn(&records), Some(EOT));
    assert_eq!(infer_end_of_turn(&records[2..3]), None);
}

/// Side calls that stop on a token of the agent's choosing (`stop_token_ids`, kept as the last
/// sampled token) outnumber the turns: the end of turn is still the turns' own.
#[test]
fn calls_stopping_on_the_callers_own_stops_do_not_pick_the_end_of_turn() {
    let with_stop = |seq: u64, stop: serde_json::Value| CompletionRecord {
        normalized_request: serde_json::json!({"stop_token_ids": stop}),
        ..rec(seq, &[1], &[30, 77], "stop")
    };
    let mut records = vec![
        rec(0, &[1], &[10, EOT], "stop"),
        rec(1, &[1], &[11, EOT], "tool_calls"),
    ];
    records.extend((2..7).map(|seq| with_stop(seq, serde_json::json!([77]))));
    assert_eq!(infer_end_of_turn(&records), Some(EOT));
    // Only such calls: theirs is all there is.
    assert_eq!(infer_end_of_turn(&records[2..]), Some(77));
    // An empty list is no stop of the caller's.
    let empty = [with_stop(9, serde_json::json!([]))];
    assert_eq!(infer_end_of_turn(&empty), Some(77));
}

#[test]
fn per_request_gives_one_trace_per_call() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let records = [
        rec(0, &p0, &[10, EOT], "stop"),
        rec(1, &p1, &[12, EOT], "stop"),
    ];
    let options = BuildOptions {
        builder: Builder::PerRequest,
        ..Default::default()
    };
    let (traces, stats) = build_traces(&records, &options);
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[1].prompt_token_ids, p1);
    assert_eq!(traces[1].loss_mask, [1, 1]);
    assert_eq!(stats.total_tokens, (2 + 2) + (5 + 2));
    assert_eq!(starts(&traces), [ChainStart::PerRequest; 2]);
}

fn session() -> SessionInfo {
    SessionInfo {
        session: "job-t1-0".into(),
        task: "t1".into(),
        group: "job/t1".into(),
        sample: 0,
        metadata: Default::default(),
    }
}

fn passed() -> SessionOutcome {
    SessionOutcome::Completed {
        evaluation: Evaluation {
            reward: Some(1.0),
            passed: Some(true),
            detail: serde_json::Value::Null,
        },
    }
}

fn two_turns() -> Vec<CompletionRecord> {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    vec![
        rec(0, &p0, &[10, EOT], "stop"),
        rec(1, &p1, &[12, EOT], "stop"),
    ]
}

#[test]
fn a_completed_session_carries_the_evaluators_reward() {
    let evaluation = Evaluation {
        reward: Some(1.0),
        passed: Some(true),
        detail: serde_json::Value::Null,
    };
    let t = build_trajectory(
        &session(),
        &two_turns(),
        &BuildOptions::default(),
        &SessionOutcome::Completed { evaluation },
    );
    assert_eq!(
        (t.status, t.trainable, t.reward),
        (SessionStatus::Completed, true, Some(1.0))
    );
    assert_eq!(t.policy_versions, [0]);
    assert_eq!(t.format, TRAJECTORY_FORMAT);
}

#[test]
fn an_agent_timeout_is_a_trainable_zero() {
    let t = build_trajectory(
        &session(),
        &two_turns(),
        &BuildOptions::default(),
        &SessionOutcome::AgentTimeout {
            evaluation: None,
            reward: 0.0,
        },
    );
    assert_eq!(
        (t.status, t.trainable, t.reward),
        (SessionStatus::Timeout, true, Some(0.0))
    );
    assert_eq!(t.stats.trainable_tokens, 4);
}

#[test]
fn an_agent_timeout_scores_the_jobs_failure_reward_and_an_older_runners_zero() {
    let timeout = |json: serde_json::Value| {
        let outcome: SessionOutcome = serde_json::from_value(json).expect("an outcome");
        build_trajectory(&session(), &two_turns(), &BuildOptions::default(), &outcome)
    };
    let t = timeout(serde_json::json!({"status": "agent_timeout", "reward": -1.0}));
    assert_eq!(
        (t.status, t.trainable, t.reward),
        (SessionStatus::Timeout, true, Some(-1.0))
    );
    // A runner from before `failureReward` sends none.
    let t = timeout(serde_json::json!({"status": "agent_timeout"}));
    assert_eq!(t.reward, Some(0.0));
}

#[test]
fn infrastructure_errors_and_evaluator_timeouts_are_untrainable_not_zero() {
    for outcome in [
        SessionOutcome::InfraError {
            message: "pod evicted".into(),
        },
        SessionOutcome::EvaluatorTimeout,
    ] {
        let t = build_trajectory(&session(), &two_turns(), &BuildOptions::default(), &outcome);
        assert_eq!(
            (t.status, t.trainable, t.reward),
            (SessionStatus::Error, false, None)
        );
        assert!(t
            .traces
            .iter()
            .all(|tr| tr.loss_mask.iter().all(|m| *m == 0)));
        assert_eq!(t.stats.trainable_tokens, 0);
        // The tokens are still there for inspection.
        assert_eq!(t.stats.sampled_tokens, 4);
    }
}

#[test]
fn an_interrupted_session_is_untrainable_with_its_masks_kept_for_a_ruling() {
    let t = build_trajectory(
        &session(),
        &two_turns(),
        &BuildOptions::default(),
        &SessionOutcome::Interrupted {
            message: "the sandbox stopped before the session finished".into(),
        },
    );
    assert_eq!(
        (t.status, t.trainable, t.reward),
        (SessionStatus::Interrupted, false, None)
    );
    assert_eq!(
        t.stats.trainable_tokens, 4,
        "as built: never a reward, kept for a ruling"
    );
    let json = serde_json::to_value(&t).expect("json");
    assert_eq!(json["status"], "interrupted");
    assert!(json["evaluation"]["detail"]["interrupted"].is_string());
}

#[test]
fn an_unparsed_tool_call_stays_a_trainable_negative() {
    let mut records = two_turns();
    records[1].unparsed_tool_call = true;
    let evaluation = Evaluation {
        reward: Some(0.0),
        passed: Some(false),
        detail: serde_json::Value::Null,
    };
    let t = build_trajectory(
        &session(),
        &records,
        &BuildOptions::default(),
        &SessionOutcome::Completed { evaluation },
    );
    assert!(t.trainable);
    assert_eq!(t.stats.unparsed_tool_calls, 1);
    assert_eq!(t.stats.trainable_tokens, 4);
}

#[test]
fn dropped_hosted_tools_are_counted_per_trajectory_and_omitted_when_none() {
    let mut records = two_turns();
    records[0].dropped = vec!["hosted_tool:web_search".into(), "document".into()];
    records[1].dropped = vec!["hosted_tool:web_search".into()];
    let t = build_trajectory(&session(), &records, &BuildOptions::default(), &passed());
    // Only hosted tools: a dropped `document` part is another kind of loss.
    assert_eq!(t.stats.dropped_hosted_tools, 2);
    let clean = build_trajectory(
        &session(),
        &two_turns(),
        &BuildOptions::default(),
        &passed(),
    );
    let wire = serde_json::to_value(&clean.stats).expect("stats serialize");
    assert!(wire.get("dropped_hosted_tools").is_none(), "{wire}");
}

/// What a captured token costs in a shipped trajectory at most ([`WORST_BYTES_PER_TOKEN`]):
/// sampled tokens with six-digit ids and log-probs at their longest, calls with tiny
/// prompts, built one trace per call (a prompt token costs less than a sampled one).
#[test]
fn a_captured_token_costs_at_most_the_worst_bytes_in_a_trajectory() {
    let records: Vec<CompletionRecord> = (0..20)
        .map(|seq| CompletionRecord {
            started_at_ms: seq,
            logprobs: Some(vec![-1.2345678901234567e-5; 500]),
            finish_reason: Some("length".into()),
            ..CompletionRecord::from_tokens(seq, vec![262_143; 3], vec![262_143; 500])
        })
        .collect();
    let captured: usize = records
        .iter()
        .map(|r| r.prompt_token_ids.len() + r.completion_token_ids.len())
        .sum();
    let options = BuildOptions {
        builder: Builder::PerRequest,
        ..Default::default()
    };
    let evaluation = Evaluation {
        reward: Some(0.0),
        passed: Some(false),
        detail: serde_json::Value::Null,
    };
    let t = build_trajectory(
        &session(),
        &records,
        &options,
        &SessionOutcome::Completed { evaluation },
    );
    let bytes = serde_json::to_vec(&t)
        .map(|b| b.len())
        .unwrap_or(usize::MAX);
    assert!(
        bytes <= captured * WORST_BYTES_PER_TOKEN,
        "{bytes} bytes for {captured} tokens: {} a token",
        bytes / captured
    );
}

/// An sft job's dataset is copied token for token: a tool call the harness could not parse
/// trains no token there (under GRPO it stays trainable: a low reward pushes it down), and
/// stays in the trace as the context later turns saw. A response cut at its cap is still the
/// teacher's, and trains.
#[test]
fn an_imitation_dataset_trains_no_token_of_a_broken_tool_call() {
    let p0 = [1, 2];
    let p1 = cat(&[&p0, &[10, EOT], &[20]]);
    let p2 = cat(&[&p1, &[11, 12, EOT], &[21]]);
    let p3 = cat(&[&p2, &[13, 14, 15], &[22]]);
    let records = [
        rec(0, &p0, &[10, EOT], "tool_calls"),
        CompletionRecord {
            unparsed_tool_call: true,
            ..rec(1, &p1, &[11, 12, EOT], "stop")
        },
        rec(2, &p2, &[13, 14, 15], "length"),
        rec(3, &p3, &[16, EOT], "stop"),
    ];
    for builder in [Builder::PerRequest, Builder::PrefixMerging] {
        let options = |imitation| BuildOptions {
            builder,
            end_of_turn: Some(EOT),
            imitation,
            ..Default::default()
        };
        let trained = |traces: &[Trace]| -> Vec<u32> {
            traces
                .iter()
                .flat_map(|t| t.response_token_ids.iter().zip(&t.loss_mask))
                .filter(|(_, m)| **m == 1)
                .map(|(t, _)| *t)
                .collect()
        };
        let (traces, stats) = build_traces(&records, &options(false));
        assert_eq!(
            trained(&traces),
            [10, EOT, 11, 12, EOT, 13, 14, 15, 16, EOT],
            "{builder:?}"
        );
        assert_eq!(stats.not_imitated_calls, 0);
        let (traces, stats) = build_traces(&records, &options(true));
        assert_eq!(
            trained(&traces),
            [10, EOT, 13, 14, 15, 16, EOT],
            "{builder:?}"
        );
        assert_eq!(stats.not_imitated_calls, 1, "{builder:?}");
        assert_eq!(stats.trainable_tokens, 7, "{builder:?}");
        let kept: usize = traces.iter().map(|t| t.response_token_ids.len()).sum();
        assert!(kept >= 10, "the tokens stay, as context: {builder:?}");
    }
}
