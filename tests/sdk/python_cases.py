"""The official Python SDKs (openai, anthropic, google-genai) against floe's gateway.

Run by tests/tests/official_sdks.rs: `python python_cases.py CONFIG` where CONFIG is a JSON
file {"url": gateway base URL, "sessions": {"<sdk>/<api>": {"main", "usage", "slow",
"fail429", "fail5xx"}: session tokens}}. Each case prints one JSON line: sdk, api, case, ok,
detail (and `usage` for the case the Rust side compares with the capture). Every call goes
through the SDK's own typed client and documented helpers, as a user's agent would make it.
"""

import json
import sys
import traceback
import typing

import anthropic
import openai
import pydantic
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gt

CONFIG = json.load(open(sys.argv[1]))
URL = CONFIG["url"]
SESSIONS = CONFIG["sessions"]
# The text the stop-sequence cases force through guided decoding, and where they stop.
FORCED = "alpha beta gamma"
STOP = "beta"
# Structured-output and forced tool-call cases sample greedily: guided JSON lets a 135M model pad whitespace until
# the token cap at temperature 1.
# Strict tools: vLLM then constrains the arguments, which a 135M model would not get right.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}


class City(pydantic.BaseModel):
    name: typing.Literal["Paris", "Rome", "Oslo"]
    capital: bool



def city(args):
    """The arguments of a get_weather call name one of its cities."""
    return isinstance(args, dict) and args.get("city") in ("Paris", "Rome", "Oslo")


def emit(sdk, api, case, ok, detail, **extra):
    print(json.dumps({"sdk": sdk, "api": api, "case": case, "ok": ok, "detail": detail, **extra}), flush=True)


def run(sdk, api, cases):
    for case, fn in cases:
        try:
            out = fn()
            extra = out if isinstance(out, dict) else {"detail": out or ""}
            emit(sdk, api, case, True, **{"detail": "", **extra})
        except Exception as e:  # noqa: BLE001 - a case's failure is reported, not raised
            tb = traceback.format_exc(limit=3)
            emit(sdk, api, case, False, f"{type(e).__name__}: {e}\n{tb}")


def expect_error(call, error_type, status):
    try:
        call()
    except error_type as e:
        got = getattr(e, "status_code", None) or getattr(e, "code", None)
        assert got == status, f"{error_type.__name__} with status {got}, expected {status}"
        return f"{type(e).__name__} {got}: {str(e)[:120]}"
    raise AssertionError(f"no {error_type.__name__}")


# --- OpenAI Chat Completions -------------------------------------------------------------


def openai_client(key, token, **kw):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key=SESSIONS[key][token], max_retries=0, **kw)


def chat_cases():
    key = "python-openai/chat"
    c = openai_client(key, "main")
    user = [{"role": "user", "content": "Say hello."}]
    weather = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                 "parameters": WEATHER_SCHEMA, "strict": True}}]
    forced = {"type": "function", "function": {"name": "get_weather"}}

    def plain():
        r = c.chat.completions.create(model="gpt-5", messages=user, max_tokens=8)
        assert isinstance(r.choices[0].message.content, str), r
        assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
        return r.choices[0].message.content

    def system():
        r = c.chat.completions.create(model="gpt-5", max_tokens=8, messages=[
            {"role": "system", "content": "You answer in French."}, *user])
        return r.choices[0].message.content

    def multi_turn():
        first = c.chat.completions.create(model="gpt-5", messages=user, max_tokens=8)
        r = c.chat.completions.create(model="gpt-5", max_tokens=8, messages=[
            *user, first.choices[0].message, {"role": "user", "content": "Again."}])
        return r.choices[0].message.content

    def stream(client):
        def case():
            text, usage, finish = "", None, None
            for chunk in client.chat.completions.create(model="gpt-5", messages=user, max_tokens=8, stream=True,
                                                        stream_options={"include_usage": True}):
                if chunk.usage:
                    usage = chunk.usage
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    finish = ch.finish_reason or finish
            assert usage and usage.completion_tokens > 0, usage
            assert finish in ("stop", "length"), finish
            return text
        return case

    def max_tokens():
        r = c.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "Write a long story."}],
                                      max_tokens=3)
        assert r.choices[0].finish_reason == "length", r.choices[0].finish_reason
        assert r.usage.completion_tokens == 3, r.usage
        return "finish_reason length"

    def stop_sequence():
        r = c.chat.completions.create(model="gpt-5", messages=user, max_tokens=16, stop=[STOP],
                                      extra_body={"structured_outputs": {"choice": [FORCED]}})
        content = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop" and STOP not in content, (r.choices[0].finish_reason, content)
        return repr(content)

    def sampling():
        args = dict(model="gpt-5", messages=user, max_tokens=8, temperature=0.0, top_p=0.5, seed=7)
        a, b = (c.chat.completions.create(**args).choices[0].message.content for _ in range(2))
        assert a == b, (a, b)
        return "temperature 0: equal answers"

    def tool_round_trip():
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        r = c.chat.completions.create(model="gpt-5", messages=msgs, tools=weather, tool_choice=forced, max_tokens=64,
                                      temperature=0.0)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and city(json.loads(call.function.arguments)), call
        msgs += [r.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = c.chat.completions.create(model="gpt-5", messages=msgs, tools=weather, max_tokens=8)
        return f"{call.function.arguments} -> {r2.choices[0].message.content!r}"

    def streamed_tool_call():
        name, args = "", ""
        for chunk in c.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                               tools=weather, tool_choice=forced, max_tokens=64, stream=True,
                                               temperature=0.0):
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
        assert name == "get_weather" and city(json.loads(args)), (name, args)
        return args

    def structured():
        r = c.chat.completions.parse(model="gpt-5", max_tokens=64, response_format=City, temperature=0.0,
                                     messages=[{"role": "user", "content": "A city, as JSON."}])
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, City), parsed
        return parsed.model_dump_json()

    def usage():
        u = openai_client(key, "usage")
        r = u.chat.completions.create(model="gpt-5", messages=user, max_tokens=8)
        return {"detail": "", "usage": {"input": r.usage.prompt_tokens, "output": r.usage.completion_tokens}}

    run("python-openai", "chat", [
        ("plain", plain), ("system", system), ("multi_turn", multi_turn), ("stream", stream(c)),
        ("stream_past_keepalive", stream(openai_client(key, "slow"))), ("max_tokens", max_tokens),
        ("stop_sequence", stop_sequence), ("sampling", sampling), ("tool_round_trip", tool_round_trip),
        ("streamed_tool_call", streamed_tool_call), ("structured_output", structured), ("usage", usage),
        ("error_401", lambda: expect_error(lambda: openai.OpenAI(base_url=f"{URL}/v1", api_key="nope", max_retries=0)
                                           .chat.completions.create(model="m", messages=user), openai.AuthenticationError, 401)),
        ("error_400", lambda: expect_error(lambda: c.chat.completions.create(model="m", messages=user, n=2),
                                           openai.BadRequestError, 400)),
        ("error_upstream_429", lambda: expect_error(lambda: openai_client(key, "fail429").chat.completions.create(
            model="m", messages=user), openai.InternalServerError, 502)),
        ("error_upstream_5xx", lambda: expect_error(lambda: openai_client(key, "fail5xx").chat.completions.create(
            model="m", messages=user), openai.InternalServerError, 502)),
    ])


# --- OpenAI Responses --------------------------------------------------------------------


def responses_cases():
    key = "python-openai/responses"
    c = openai_client(key, "main")
    weather = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                "parameters": WEATHER_SCHEMA, "strict": True}]
    forced = {"type": "function", "name": "get_weather"}

    def plain():
        r = c.responses.create(model="gpt-5", input="Say hello.", max_output_tokens=16)
        assert r.status in ("completed", "incomplete") and r.output_text, r
        return r.output_text

    def system():
        return c.responses.create(model="gpt-5", instructions="You answer in French.", input="Say hello.",
                                  max_output_tokens=16).output_text

    def multi_turn():
        first = c.responses.create(model="gpt-5", input="Say hello.", max_output_tokens=16)
        r = c.responses.create(model="gpt-5", max_output_tokens=16, input=[
            {"role": "user", "content": "Say hello."}, *first.output, {"role": "user", "content": "Again."}])
        return r.output_text

    def stream(client):
        # Typed events; the last is response.completed, or response.incomplete when the
        # answer hit max_output_tokens (the SDK's stream helper accepts only the former).
        def case():
            deltas, final = [], None
            for e in client.responses.create(model="gpt-5", input="Say hello.", max_output_tokens=16, stream=True):
                if e.type == "response.output_text.delta":
                    deltas.append(e.delta)
                elif e.type in ("response.completed", "response.incomplete"):
                    final = e.response
            assert final and "".join(deltas) == final.output_text, (deltas, final)
            return f"{final.status}: {final.output_text}"
        return case

    def max_tokens():
        r = c.responses.create(model="gpt-5", input="Write a long story.", max_output_tokens=3)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
        return "incomplete: max_output_tokens"

    def sampling():
        args = dict(model="gpt-5", input="Say hello.", max_output_tokens=8, temperature=0.0, top_p=0.5)
        a, b = (c.responses.create(**args).output_text for _ in range(2))
        assert a == b, (a, b)
        return "temperature 0: equal answers"

    def tool_round_trip():
        items = [{"role": "user", "content": "Weather in Paris?"}]
        r = c.responses.create(model="gpt-5", input=items, tools=weather, tool_choice=forced, max_output_tokens=64,
                               temperature=0.0)
        call = next(o for o in r.output if o.type == "function_call")
        assert call.name == "get_weather" and city(json.loads(call.arguments)), call
        items += [*r.output, {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
        r2 = c.responses.create(model="gpt-5", input=items, tools=weather, max_output_tokens=8)
        return f"{call.arguments} -> {r2.output_text!r}"

    def streamed_tool_call():
        with c.responses.stream(model="gpt-5", input="Weather in Rome?", tools=weather, tool_choice=forced,
                                max_output_tokens=64, temperature=0.0) as s:
            done = [e for e in s if e.type == "response.function_call_arguments.done"]
            final = s.get_final_response()
        assert done and any(o.type == "function_call" for o in final.output), final.output
        assert city(json.loads(done[0].arguments)), done[0].arguments
        return done[0].arguments

    def structured():
        r = c.responses.parse(model="gpt-5", input="A city, as JSON.", text_format=City, max_output_tokens=64,
                              temperature=0.0)
        assert isinstance(r.output_parsed, City), r.output_parsed
        return r.output_parsed.model_dump_json()

    def usage():
        r = openai_client(key, "usage").responses.create(model="gpt-5", input="Say hello.", max_output_tokens=8)
        return {"detail": "", "usage": {"input": r.usage.input_tokens, "output": r.usage.output_tokens}}

    run("python-openai", "responses", [
        ("plain", plain), ("system", system), ("multi_turn", multi_turn), ("stream", stream(c)),
        ("stream_past_keepalive", stream(openai_client(key, "slow"))), ("max_tokens", max_tokens),
        ("sampling", sampling), ("tool_round_trip", tool_round_trip), ("streamed_tool_call", streamed_tool_call),
        ("structured_output", structured), ("usage", usage),
        ("error_401", lambda: expect_error(lambda: openai.OpenAI(base_url=f"{URL}/v1", api_key="nope", max_retries=0)
                                           .responses.create(model="m", input="x"), openai.AuthenticationError, 401)),
        ("error_400", lambda: expect_error(lambda: c.responses.create(model="m", input=[{"role": "oracle", "content": "x"}]),
                                           openai.BadRequestError, 400)),
        ("error_upstream_429", lambda: expect_error(lambda: openai_client(key, "fail429").responses.create(
            model="m", input="x"), openai.InternalServerError, 502)),
        ("error_upstream_5xx", lambda: expect_error(lambda: openai_client(key, "fail5xx").responses.create(
            model="m", input="x"), openai.InternalServerError, 502)),
    ])


# --- Anthropic Messages ------------------------------------------------------------------


def anthropic_client(key, token):
    return anthropic.Anthropic(base_url=URL, api_key=SESSIONS[key][token], max_retries=0)


def anthropic_cases():
    key = "python-anthropic/messages"
    c = anthropic_client(key, "main")
    user = [{"role": "user", "content": "Say hello."}]
    weather = [{"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER_SCHEMA,
                "strict": True}]
    forced = {"type": "tool", "name": "get_weather"}
    model = "claude-sonnet-5-5"

    def text(msg):
        return "".join(b.text for b in msg.content if b.type == "text")

    def plain():
        m = c.messages.create(model=model, max_tokens=8, messages=user)
        assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
        return text(m)

    def system():
        return text(c.messages.create(model=model, max_tokens=8, system="You answer in French.", messages=user))

    def multi_turn():
        first = c.messages.create(model=model, max_tokens=8, messages=user)
        m = c.messages.create(model=model, max_tokens=8, messages=[
            *user, {"role": "assistant", "content": first.content}, {"role": "user", "content": "Again."}])
        return text(m)

    def stream(client):
        def case():
            with client.messages.stream(model=model, max_tokens=8, messages=user) as s:
                streamed = "".join(s.text_stream)
                final = s.get_final_message()
            assert streamed == text(final) and final.usage.output_tokens > 0, (streamed, final)
            return streamed
        return case

    def max_tokens():
        m = c.messages.create(model=model, max_tokens=3, messages=[{"role": "user", "content": "Write a long story."}])
        assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3, m
        return "stop_reason max_tokens"

    def stop_sequence():
        forced_text = {"format": {"type": "json_schema", "schema": {"type": "string", "enum": [FORCED]}}}
        m = c.messages.create(model=model, max_tokens=16, messages=user, stop_sequences=[STOP],
                              output_config=forced_text)
        assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", STOP), (m.stop_reason, m.stop_sequence, m.content)
        with c.messages.stream(model=model, max_tokens=16, messages=user, stop_sequences=[STOP],
                               output_config=forced_text) as s:
            final = s.get_final_message()
        assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", STOP), final
        return f"{text(m)!r} stop_sequence={m.stop_sequence!r} (JSON and stream)"

    def sampling():
        # This SDK's typed create() has no sampling parameters: the documented extra_body.
        args = dict(model=model, max_tokens=8, messages=user,
                    extra_body={"temperature": 0.0, "top_p": 0.5, "top_k": 20})
        a, b = (text(c.messages.create(**args)) for _ in range(2))
        assert a == b, (a, b)
        return "temperature 0: equal answers"

    def tool_round_trip():
        msgs = [{"role": "user", "content": "Weather in Paris?"}]
        m = c.messages.create(model=model, max_tokens=64, messages=msgs, tools=weather, tool_choice=forced,
                              extra_body={"temperature": 0.0})
        use = next(b for b in m.content if b.type == "tool_use")
        assert m.stop_reason == "tool_use" and use.name == "get_weather" and city(use.input), m
        msgs += [{"role": "assistant", "content": m.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]}]
        m2 = c.messages.create(model=model, max_tokens=8, messages=msgs, tools=weather)
        return f"{use.input} -> {text(m2)!r}"

    def streamed_tool_call():
        with c.messages.stream(model=model, max_tokens=64, tools=weather, tool_choice=forced,
                               extra_body={"temperature": 0.0},
                               messages=[{"role": "user", "content": "Weather in Rome?"}]) as s:
            final = s.get_final_message()
        use = next(b for b in final.content if b.type == "tool_use")
        assert use.name == "get_weather" and city(use.input), final
        return json.dumps(use.input)

    def structured():
        m = c.messages.parse(model=model, max_tokens=64, output_format=City, extra_body={"temperature": 0.0},
                             messages=[{"role": "user", "content": "A city, as JSON."}])
        assert isinstance(m.parsed_output, City), m.parsed_output
        return m.parsed_output.model_dump_json()

    def count_tokens():
        counted = c.messages.count_tokens(model=model, system="Be brief.", messages=user)
        m = c.messages.create(model=model, max_tokens=4, system="Be brief.", messages=user)
        assert counted.input_tokens == m.usage.input_tokens, (counted, m.usage)
        return f"{counted.input_tokens} = usage.input_tokens"

    def usage():
        m = anthropic_client(key, "usage").messages.create(model=model, max_tokens=8, messages=user)
        return {"detail": "", "usage": {"input": m.usage.input_tokens, "output": m.usage.output_tokens}}

    run("python-anthropic", "messages", [
        ("plain", plain), ("system", system), ("multi_turn", multi_turn), ("stream", stream(c)),
        ("stream_past_keepalive", stream(anthropic_client(key, "slow"))), ("max_tokens", max_tokens),
        ("stop_sequence", stop_sequence), ("sampling", sampling), ("tool_round_trip", tool_round_trip),
        ("streamed_tool_call", streamed_tool_call), ("structured_output", structured),
        ("count_tokens", count_tokens), ("usage", usage),
        ("error_401", lambda: expect_error(lambda: anthropic.Anthropic(base_url=URL, api_key="nope", max_retries=0)
                                           .messages.create(model=model, max_tokens=4, messages=user),
                                           anthropic.AuthenticationError, 401)),
        ("error_400", lambda: expect_error(lambda: c.messages.create(model=model, max_tokens=4, messages=[
            {"role": "oracle", "content": "x"}]), anthropic.BadRequestError, 400)),
        ("error_upstream_429", lambda: expect_error(lambda: anthropic_client(key, "fail429").messages.create(
            model=model, max_tokens=4, messages=user), anthropic.InternalServerError, 502)),
        ("error_upstream_5xx", lambda: expect_error(lambda: anthropic_client(key, "fail5xx").messages.create(
            model=model, max_tokens=4, messages=user), anthropic.InternalServerError, 502)),
    ])


# --- Gemini ------------------------------------------------------------------------------


# A genai.Client closes its connections when collected: the cases keep theirs.
GEMINI_CLIENTS = {}


def gemini_client(key, token, api_key=None):
    api_key = api_key or SESSIONS[key][token]
    if api_key not in GEMINI_CLIENTS:
        GEMINI_CLIENTS[api_key] = genai.Client(
            api_key=api_key, http_options=gt.HttpOptions(base_url=URL, api_version="v1beta",
                                                         retry_options=gt.HttpRetryOptions(attempts=1)))
    return GEMINI_CLIENTS[api_key]


def gemini_cases():
    key = "python-google-genai/gemini"
    c = gemini_client(key, "main")
    model = "gemini-2.5-flash"
    weather = gt.Tool(function_declarations=[gt.FunctionDeclaration(
        name="get_weather", description="Weather of a city", parameters_json_schema=WEATHER_SCHEMA)])
    forced = gt.ToolConfig(function_calling_config=gt.FunctionCallingConfig(mode="ANY"))
    no_afc = gt.AutomaticFunctionCallingConfig(disable=True)

    def cfg(**kw):
        return gt.GenerateContentConfig(max_output_tokens=kw.pop("max_output_tokens", 8), **kw)

    def plain():
        r = c.models.generate_content(model=model, contents="Say hello.", config=cfg())
        assert r.candidates[0].finish_reason in (gt.FinishReason.STOP, gt.FinishReason.MAX_TOKENS), r
        return r.text

    def system():
        return c.models.generate_content(model=model, contents="Say hello.",
                                         config=cfg(system_instruction="You answer in French.")).text

    def multi_turn():
        chat = c.chats.create(model=model, config=cfg())
        chat.send_message("Say hello.")
        r = chat.send_message("Again.")
        assert len(chat.get_history()) == 4, chat.get_history()
        return r.text

    def stream(client):
        def case():
            chunks = list(client.models.generate_content_stream(model=model, contents="Say hello.", config=cfg()))
            assert chunks and chunks[-1].usage_metadata.candidates_token_count > 0, chunks
            return "".join(ch.text or "" for ch in chunks)
        return case

    def max_tokens():
        r = c.models.generate_content(model=model, contents="Write a long story.", config=cfg(max_output_tokens=3))
        assert r.candidates[0].finish_reason == gt.FinishReason.MAX_TOKENS, r.candidates[0].finish_reason
        assert r.usage_metadata.candidates_token_count == 3, r.usage_metadata
        return "finishReason MAX_TOKENS"

    def stop_sequence():
        r = c.models.generate_content(model=model, contents="Say hello.", config=cfg(
            max_output_tokens=16, stop_sequences=[STOP], response_mime_type="text/x.enum",
            response_schema={"type": "STRING", "enum": [FORCED]}))
        assert r.candidates[0].finish_reason == gt.FinishReason.STOP and STOP not in r.text, r
        return repr(r.text)

    def sampling():
        config = cfg(temperature=0.0, top_p=0.5, top_k=20, seed=7)
        a, b = (c.models.generate_content(model=model, contents="Say hello.", config=config).text for _ in range(2))
        assert a == b, (a, b)
        return "temperature 0: equal answers"

    def tool_round_trip():
        # The documented manual loop: the call's content back, then Part.from_function_response.
        contents = [gt.Content(role="user", parts=[gt.Part(text="Weather in Paris?")])]
        config = cfg(max_output_tokens=64, tools=[weather], tool_config=forced, automatic_function_calling=no_afc,
                     temperature=0.0)
        r = c.models.generate_content(model=model, contents=contents, config=config)
        call = r.function_calls[0]
        assert call.name == "get_weather" and city(call.args), r
        contents += [r.candidates[0].content, gt.Content(role="user", parts=[
            gt.Part.from_function_response(name=call.name, response={"weather": "sunny, 21 C"})])]
        r2 = c.models.generate_content(model=model, contents=contents,
                                       config=cfg(tools=[weather], automatic_function_calling=no_afc))
        return f"{call.args} -> {r2.text!r}"

    def streamed_tool_call():
        calls = [fc for ch in c.models.generate_content_stream(
            model=model, contents="Weather in Rome?",
            config=cfg(max_output_tokens=64, tools=[weather], tool_config=forced, automatic_function_calling=no_afc,
                       temperature=0.0))
            for fc in (ch.function_calls or [])]
        assert calls and calls[0].name == "get_weather" and city(calls[0].args), calls
        return json.dumps(calls[0].args)

    def structured():
        r = c.models.generate_content(model=model, contents="A city, as JSON.", config=cfg(
            max_output_tokens=64, response_mime_type="application/json", response_schema=City, temperature=0.0))
        assert isinstance(r.parsed, City), (r.parsed, r.text)
        enum = c.models.generate_content(model=model, contents="A colour.", config=cfg(
            response_mime_type="text/x.enum", response_schema={"type": "STRING", "enum": ["red", "blue"]}))
        assert enum.text in ("red", "blue"), enum.text
        return f"{r.parsed.model_dump_json()}; enum {enum.text}"

    def count_tokens():
        counted = c.models.count_tokens(model=model, contents="Say hello.")
        r = c.models.generate_content(model=model, contents="Say hello.", config=cfg(max_output_tokens=4))
        assert counted.total_tokens == r.usage_metadata.prompt_token_count, (counted, r.usage_metadata)
        return f"{counted.total_tokens} = promptTokenCount"

    def usage():
        r = gemini_client(key, "usage").models.generate_content(model=model, contents="Say hello.", config=cfg())
        u = r.usage_metadata
        return {"detail": "", "usage": {"input": u.prompt_token_count, "output": u.candidates_token_count}}

    run("python-google-genai", "gemini", [
        ("plain", plain), ("system", system), ("multi_turn", multi_turn), ("stream", stream(c)),
        ("stream_past_keepalive", stream(gemini_client(key, "slow"))), ("max_tokens", max_tokens),
        ("stop_sequence", stop_sequence), ("sampling", sampling), ("tool_round_trip", tool_round_trip),
        ("streamed_tool_call", streamed_tool_call), ("structured_output", structured),
        ("count_tokens", count_tokens), ("usage", usage),
        ("error_401", lambda: expect_error(lambda: gemini_client(key, "main", api_key="nope").models.generate_content(
            model=model, contents="x"), genai_errors.ClientError, 401)),
        ("error_400", lambda: expect_error(lambda: c.models.generate_content(
            model=model, contents="x", config=cfg(candidate_count=2)), genai_errors.ClientError, 400)),
        ("error_upstream_429", lambda: expect_error(lambda: gemini_client(key, "fail429").models.generate_content(
            model=model, contents="x"), genai_errors.ServerError, 502)),
        ("error_upstream_5xx", lambda: expect_error(lambda: gemini_client(key, "fail5xx").models.generate_content(
            model=model, contents="x"), genai_errors.ServerError, 502)),
    ])


if __name__ == "__main__":
    only = sys.argv[2:]
    for name, fn in [("chat", chat_cases), ("responses", responses_cases), ("anthropic", anthropic_cases),
                     ("gemini", gemini_cases)]:
        if not only or name in only:
            fn()
