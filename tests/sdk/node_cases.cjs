// The official Node SDKs (openai, @anthropic-ai/sdk, @google/genai) against floe's gateway:
// the same cases as python_cases.py, through each SDK's typed client and documented helpers.
// `node node_cases.cjs SDK_DIR CONFIG [api…]`; SDK_DIR is scripts/sdks/install.sh's cache.
// One JSON line per case: sdk, api, case, ok, detail (and `usage` for the capture check).
"use strict";
const fs = require("fs");
const { createRequire } = require("module");

const sdk = createRequire(`${process.argv[2]}/node_modules/`);
const OpenAI = sdk("openai");
const Anthropic = sdk("@anthropic-ai/sdk");
const genai = sdk("@google/genai");

const CONFIG = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const URL = CONFIG.url;
const SESSIONS = CONFIG.sessions;
const FORCED = "alpha beta gamma";
const STOP = "beta";
// Structured-output and forced tool-call cases sample greedily: guided JSON lets a 135M model pad whitespace until
// the token cap at temperature 1.
// Strict tools: vLLM then constrains the arguments, which a 135M model would not get right.
const WEATHER_SCHEMA = {
  type: "object",
  properties: { city: { type: "string", enum: ["Paris", "Rome", "Oslo"] } },
  required: ["city"],
  additionalProperties: false,
};
const CITY_SCHEMA = {
  type: "object",
  properties: { name: { type: "string", enum: ["Paris", "Rome", "Oslo"] }, capital: { type: "boolean" } },
  required: ["name", "capital"],
  additionalProperties: false,
};

function assert(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${typeof what === "string" ? what : JSON.stringify(what)}`);
}

// The arguments of a get_weather call name one of its cities.
function city(args) {
  return args && ["Paris", "Rome", "Oslo"].includes(args.city);
}

function isCity(value) {
  return value && ["Paris", "Rome", "Oslo"].includes(value.name) && typeof value.capital === "boolean";
}

async function run(sdkName, api, cases) {
  for (const [name, fn] of cases) {
    let line;
    try {
      const out = await fn();
      line = { sdk: sdkName, api, case: name, ok: true, detail: "", ...(typeof out === "object" ? out : { detail: String(out ?? "") }) };
    } catch (e) {
      line = { sdk: sdkName, api, case: name, ok: false, detail: `${e && e.constructor ? e.constructor.name : "Error"}: ${e && e.stack ? e.stack.split("\n").slice(0, 4).join("\n") : e}` };
    }
    process.stdout.write(JSON.stringify(line) + "\n");
  }
}

async function expectError(call, errorType, status) {
  try {
    await call();
  } catch (e) {
    assert(e instanceof errorType, `${errorType.name} expected, got ${e && e.constructor && e.constructor.name}: ${e}`);
    assert(e.status === status, `status ${e.status}, expected ${status}`);
    return `${e.constructor.name} ${e.status}: ${String(e.message).slice(0, 120)}`;
  }
  throw new Error(`no ${errorType.name}`);
}

// --- OpenAI Chat Completions and Responses -------------------------------------------------

function openai(key, token, apiKey) {
  return new OpenAI.OpenAI({ baseURL: `${URL}/v1`, apiKey: apiKey || SESSIONS[key][token], maxRetries: 0 });
}

async function chatCases() {
  const key = "node-openai/chat";
  const c = openai(key, "main");
  const user = [{ role: "user", content: "Say hello." }];
  const weather = [{ type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: WEATHER_SCHEMA, strict: true } }];
  const forced = { type: "function", function: { name: "get_weather" } };
  const create = (body, client = c) => client.chat.completions.create({ model: "gpt-5", max_tokens: 8, messages: user, ...body });
  const stream = (client) => async () => {
    let text = "", usage = null, finish = null;
    for await (const chunk of await create({ stream: true, stream_options: { include_usage: true } }, client)) {
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        text += ch.delta.content || "";
        finish = ch.finish_reason || finish;
      }
    }
    assert(usage && usage.completion_tokens > 0 && ["stop", "length"].includes(finish), { usage, finish });
    return text;
  };
  await run("node-openai", "chat", [
    ["plain", async () => {
      const r = await create({});
      assert(typeof r.choices[0].message.content === "string" && ["stop", "length"].includes(r.choices[0].finish_reason), r);
      return r.choices[0].message.content;
    }],
    ["system", async () => (await create({ messages: [{ role: "system", content: "You answer in French." }, ...user] })).choices[0].message.content],
    ["multi_turn", async () => {
      const first = await create({});
      return (await create({ messages: [...user, first.choices[0].message, { role: "user", content: "Again." }] })).choices[0].message.content;
    }],
    ["stream", stream(c)],
    ["stream_past_keepalive", stream(openai(key, "slow"))],
    ["max_tokens", async () => {
      const r = await create({ max_tokens: 3, messages: [{ role: "user", content: "Write a long story." }] });
      assert(r.choices[0].finish_reason === "length" && r.usage.completion_tokens === 3, r);
      return "finish_reason length";
    }],
    ["stop_sequence", async () => {
      const r = await create({ max_tokens: 16, stop: [STOP], structured_outputs: { choice: [FORCED] } });
      const content = r.choices[0].message.content;
      assert(r.choices[0].finish_reason === "stop" && !content.includes(STOP), r.choices[0]);
      return JSON.stringify(content);
    }],
    ["sampling", async () => {
      const body = { temperature: 0, top_p: 0.5, seed: 7 };
      const [a, b] = [await create(body), await create(body)].map((r) => r.choices[0].message.content);
      assert(a === b, [a, b]);
      return "temperature 0: equal answers";
    }],
    ["tool_round_trip", async () => {
      const msgs = [{ role: "user", content: "Weather in Paris?" }];
      const r = await create({ messages: msgs, tools: weather, tool_choice: forced, max_tokens: 64, temperature: 0 });
      const call = r.choices[0].message.tool_calls[0];
      assert(call.function.name === "get_weather" && city(JSON.parse(call.function.arguments)), call);
      msgs.push(r.choices[0].message, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" });
      const r2 = await create({ messages: msgs, tools: weather });
      return `${call.function.arguments} -> ${JSON.stringify(r2.choices[0].message.content)}`;
    }],
    ["streamed_tool_call", async () => {
      // The SDK's stream helper assembles the call from its deltas.
      const s = c.chat.completions.stream({ model: "gpt-5", messages: [{ role: "user", content: "Weather in Rome?" }], tools: weather, tool_choice: forced, max_tokens: 64, temperature: 0 });
      const final = await s.finalChatCompletion();
      const call = final.choices[0].message.tool_calls[0];
      assert(call.function.name === "get_weather" && city(JSON.parse(call.function.arguments)), call);
      return call.function.arguments;
    }],
    ["structured_output", async () => {
      const r = await create({ max_tokens: 64, temperature: 0, messages: [{ role: "user", content: "A city, as JSON." }], response_format: { type: "json_schema", json_schema: { name: "city", schema: CITY_SCHEMA, strict: true } } });
      const parsed = JSON.parse(r.choices[0].message.content);
      assert(isCity(parsed), parsed);
      return JSON.stringify(parsed);
    }],
    ["usage", async () => {
      const r = await create({}, openai(key, "usage"));
      return { usage: { input: r.usage.prompt_tokens, output: r.usage.completion_tokens } };
    }],
    ["error_401", () => expectError(() => create({}, openai(key, "main", "nope")), OpenAI.AuthenticationError, 401)],
    ["error_400", () => expectError(() => create({ n: 2 }), OpenAI.BadRequestError, 400)],
    ["error_upstream_429", () => expectError(() => create({}, openai(key, "fail429")), OpenAI.InternalServerError, 502)],
    ["error_upstream_5xx", () => expectError(() => create({}, openai(key, "fail5xx")), OpenAI.InternalServerError, 502)],
  ]);
}

async function responsesCases() {
  const key = "node-openai/responses";
  const c = openai(key, "main");
  const weather = [{ type: "function", name: "get_weather", description: "Weather of a city", parameters: WEATHER_SCHEMA, strict: true }];
  const forced = { type: "function", name: "get_weather" };
  const create = (body, client = c) => client.responses.create({ model: "gpt-5", input: "Say hello.", max_output_tokens: 16, ...body });
  const stream = (client) => async () => {
    // Typed events; the last is response.completed, or response.incomplete at the token cap.
    let deltas = "", final = null;
    for await (const e of await create({ stream: true }, client)) {
      if (e.type === "response.output_text.delta") deltas += e.delta;
      else if (e.type === "response.completed" || e.type === "response.incomplete") final = e.response;
    }
    assert(final && deltas === final.output.flatMap((o) => o.content || []).map((p) => p.text || "").join(""), { deltas, final });
    return `${final.status}: ${deltas}`;
  };
  await run("node-openai", "responses", [
    ["plain", async () => {
      const r = await create({});
      assert(["completed", "incomplete"].includes(r.status) && r.output_text, r);
      return r.output_text;
    }],
    ["system", async () => (await create({ instructions: "You answer in French." })).output_text],
    ["multi_turn", async () => {
      const first = await create({});
      return (await create({ input: [{ role: "user", content: "Say hello." }, ...first.output, { role: "user", content: "Again." }] })).output_text;
    }],
    ["stream", stream(c)],
    ["stream_past_keepalive", stream(openai(key, "slow"))],
    ["max_tokens", async () => {
      const r = await create({ input: "Write a long story.", max_output_tokens: 3 });
      assert(r.status === "incomplete" && r.incomplete_details.reason === "max_output_tokens", r);
      return "incomplete: max_output_tokens";
    }],
    ["sampling", async () => {
      const body = { temperature: 0, top_p: 0.5, max_output_tokens: 8 };
      const [a, b] = [await create(body), await create(body)].map((r) => r.output_text);
      assert(a === b, [a, b]);
      return "temperature 0: equal answers";
    }],
    ["tool_round_trip", async () => {
      const items = [{ role: "user", content: "Weather in Paris?" }];
      const r = await create({ input: items, tools: weather, tool_choice: forced, max_output_tokens: 64, temperature: 0 });
      const call = r.output.find((o) => o.type === "function_call");
      assert(call && call.name === "get_weather" && city(JSON.parse(call.arguments)), r.output);
      items.push(...r.output, { type: "function_call_output", call_id: call.call_id, output: "sunny, 21 C" });
      const r2 = await create({ input: items, tools: weather, max_output_tokens: 8 });
      return `${call.arguments} -> ${JSON.stringify(r2.output_text)}`;
    }],
    ["streamed_tool_call", async () => {
      const s = c.responses.stream({ model: "gpt-5", input: "Weather in Rome?", tools: weather, tool_choice: forced, max_output_tokens: 64, temperature: 0 });
      let args = null;
      for await (const e of s) if (e.type === "response.function_call_arguments.done") args = e.arguments;
      const final = await s.finalResponse();
      assert(args && final.output.some((o) => o.type === "function_call"), final.output);
      assert(city(JSON.parse(args)), args);
      return args;
    }],
    ["structured_output", async () => {
      const r = await create({ input: "A city, as JSON.", max_output_tokens: 64, temperature: 0, text: { format: { type: "json_schema", name: "city", schema: CITY_SCHEMA, strict: true } } });
      const parsed = JSON.parse(r.output_text);
      assert(isCity(parsed), parsed);
      return JSON.stringify(parsed);
    }],
    ["usage", async () => {
      const r = await create({ max_output_tokens: 8 }, openai(key, "usage"));
      return { usage: { input: r.usage.input_tokens, output: r.usage.output_tokens } };
    }],
    ["error_401", () => expectError(() => create({}, openai(key, "main", "nope")), OpenAI.AuthenticationError, 401)],
    ["error_400", () => expectError(() => create({ input: [{ role: "oracle", content: "x" }] }), OpenAI.BadRequestError, 400)],
    ["error_upstream_429", () => expectError(() => create({}, openai(key, "fail429")), OpenAI.InternalServerError, 502)],
    ["error_upstream_5xx", () => expectError(() => create({}, openai(key, "fail5xx")), OpenAI.InternalServerError, 502)],
  ]);
}

// --- Anthropic Messages --------------------------------------------------------------------

async function anthropicCases() {
  const key = "node-anthropic/messages";
  const client = (token, apiKey) => new Anthropic.Anthropic({ baseURL: URL, apiKey: apiKey || SESSIONS[key][token], maxRetries: 0 });
  const c = client("main");
  const model = "claude-sonnet-5-5";
  const user = [{ role: "user", content: "Say hello." }];
  const weather = [{ name: "get_weather", description: "Weather of a city", input_schema: WEATHER_SCHEMA, strict: true }];
  const forced = { type: "tool", name: "get_weather" };
  const forcedText = { format: { type: "json_schema", schema: { type: "string", enum: [FORCED] } } };
  const text = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  const create = (body, cl = c) => cl.messages.create({ model, max_tokens: 8, messages: user, ...body });
  const stream = (cl) => async () => {
    const s = cl.messages.stream({ model, max_tokens: 8, messages: user });
    let streamed = "";
    s.on("text", (t) => { streamed += t; });
    const final = await s.finalMessage();
    assert(streamed === text(final) && final.usage.output_tokens > 0, { streamed, final });
    return streamed;
  };
  await run("node-anthropic", "messages", [
    ["plain", async () => {
      const m = await create({});
      assert(["end_turn", "max_tokens"].includes(m.stop_reason), m);
      return text(m);
    }],
    ["system", async () => text(await create({ system: "You answer in French." }))],
    ["multi_turn", async () => {
      const first = await create({});
      return text(await create({ messages: [...user, { role: "assistant", content: first.content }, { role: "user", content: "Again." }] }));
    }],
    ["stream", stream(c)],
    ["stream_past_keepalive", stream(client("slow"))],
    ["max_tokens", async () => {
      const m = await create({ max_tokens: 3, messages: [{ role: "user", content: "Write a long story." }] });
      assert(m.stop_reason === "max_tokens" && m.usage.output_tokens === 3, m);
      return "stop_reason max_tokens";
    }],
    ["stop_sequence", async () => {
      const m = await create({ max_tokens: 16, stop_sequences: [STOP], output_config: forcedText });
      assert(m.stop_reason === "stop_sequence" && m.stop_sequence === STOP, m);
      const final = await c.messages.stream({ model, max_tokens: 16, messages: user, stop_sequences: [STOP], output_config: forcedText }).finalMessage();
      assert(final.stop_reason === "stop_sequence" && final.stop_sequence === STOP, final);
      return `${JSON.stringify(text(m))} stop_sequence=${m.stop_sequence} (JSON and stream)`;
    }],
    ["sampling", async () => {
      // Not in this SDK's typed params any more; the body goes to the API as given.
      const body = { temperature: 0, top_p: 0.5, top_k: 20 };
      const [a, b] = [await create(body), await create(body)].map(text);
      assert(a === b, [a, b]);
      return "temperature 0: equal answers";
    }],
    ["tool_round_trip", async () => {
      const msgs = [{ role: "user", content: "Weather in Paris?" }];
      const m = await create({ max_tokens: 64, temperature: 0, messages: msgs, tools: weather, tool_choice: forced });
      const use = m.content.find((b) => b.type === "tool_use");
      assert(m.stop_reason === "tool_use" && use && use.name === "get_weather" && city(use.input), m);
      msgs.push({ role: "assistant", content: m.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 21 C" }] });
      const m2 = await create({ messages: msgs, tools: weather });
      return `${JSON.stringify(use.input)} -> ${JSON.stringify(text(m2))}`;
    }],
    ["streamed_tool_call", async () => {
      const final = await c.messages.stream({ model, max_tokens: 64, temperature: 0, tools: weather, tool_choice: forced, messages: [{ role: "user", content: "Weather in Rome?" }] }).finalMessage();
      const use = final.content.find((b) => b.type === "tool_use");
      assert(use && use.name === "get_weather" && city(use.input), final);
      return JSON.stringify(use.input);
    }],
    ["structured_output", async () => {
      const m = await create({ max_tokens: 64, temperature: 0, messages: [{ role: "user", content: "A city, as JSON." }], output_config: { format: { type: "json_schema", schema: CITY_SCHEMA } } });
      const parsed = JSON.parse(text(m));
      assert(isCity(parsed), parsed);
      return JSON.stringify(parsed);
    }],
    ["count_tokens", async () => {
      const counted = await c.messages.countTokens({ model, system: "Be brief.", messages: user });
      const m = await create({ max_tokens: 4, system: "Be brief." });
      assert(counted.input_tokens === m.usage.input_tokens, { counted, usage: m.usage });
      return `${counted.input_tokens} = usage.input_tokens`;
    }],
    ["usage", async () => {
      const m = await create({}, client("usage"));
      return { usage: { input: m.usage.input_tokens, output: m.usage.output_tokens } };
    }],
    ["error_401", () => expectError(() => create({}, client("main", "nope")), Anthropic.AuthenticationError, 401)],
    ["error_400", () => expectError(() => create({ messages: [{ role: "oracle", content: "x" }] }), Anthropic.BadRequestError, 400)],
    ["error_upstream_429", () => expectError(() => create({}, client("fail429")), Anthropic.InternalServerError, 502)],
    ["error_upstream_5xx", () => expectError(() => create({}, client("fail5xx")), Anthropic.InternalServerError, 502)],
  ]);
}

// --- Gemini --------------------------------------------------------------------------------

async function geminiCases() {
  const key = "node-google-genai/gemini";
  const client = (token, apiKey) => new genai.GoogleGenAI({ apiKey: apiKey || SESSIONS[key][token], httpOptions: { baseUrl: URL, apiVersion: "v1beta", retryOptions: { attempts: 1 } } });
  const c = client("main");
  const model = "gemini-2.5-flash";
  const weather = [{ functionDeclarations: [{ name: "get_weather", description: "Weather of a city", parametersJsonSchema: WEATHER_SCHEMA }] }];
  const forced = { functionCallingConfig: { mode: genai.FunctionCallingConfigMode.ANY } };
  const generate = (config = {}, contents = "Say hello.", cl = c) => cl.models.generateContent({ model, contents, config: { maxOutputTokens: 8, ...config } });
  const stream = (cl) => async () => {
    const chunks = [];
    for await (const ch of await cl.models.generateContentStream({ model, contents: "Say hello.", config: { maxOutputTokens: 8 } })) chunks.push(ch);
    assert(chunks.length && chunks[chunks.length - 1].usageMetadata.candidatesTokenCount > 0, chunks);
    return chunks.map((ch) => ch.text || "").join("");
  };
  await run("node-google-genai", "gemini", [
    ["plain", async () => {
      const r = await generate();
      assert([genai.FinishReason.STOP, genai.FinishReason.MAX_TOKENS].includes(r.candidates[0].finishReason), r);
      return r.text;
    }],
    ["system", async () => (await generate({ systemInstruction: "You answer in French." })).text],
    ["multi_turn", async () => {
      const chat = c.chats.create({ model, config: { maxOutputTokens: 8 } });
      await chat.sendMessage({ message: "Say hello." });
      const r = await chat.sendMessage({ message: "Again." });
      assert(chat.getHistory().length === 4, chat.getHistory());
      return r.text;
    }],
    ["stream", stream(c)],
    ["stream_past_keepalive", stream(client("slow"))],
    ["max_tokens", async () => {
      const r = await generate({ maxOutputTokens: 3 }, "Write a long story.");
      assert(r.candidates[0].finishReason === genai.FinishReason.MAX_TOKENS && r.usageMetadata.candidatesTokenCount === 3, r);
      return "finishReason MAX_TOKENS";
    }],
    ["stop_sequence", async () => {
      const r = await generate({ maxOutputTokens: 16, stopSequences: [STOP], responseMimeType: "text/x.enum", responseSchema: { type: "STRING", enum: [FORCED] } });
      assert(r.candidates[0].finishReason === genai.FinishReason.STOP && !r.text.includes(STOP), r);
      return JSON.stringify(r.text);
    }],
    ["sampling", async () => {
      const config = { temperature: 0, topP: 0.5, topK: 20, seed: 7 };
      const [a, b] = [await generate(config), await generate(config)].map((r) => r.text);
      assert(a === b, [a, b]);
      return "temperature 0: equal answers";
    }],
    ["tool_round_trip", async () => {
      // The documented manual loop: the call's content back, then createPartFromFunctionResponse.
      const contents = [{ role: "user", parts: [{ text: "Weather in Paris?" }] }];
      const r = await generate({ maxOutputTokens: 64, temperature: 0, tools: weather, toolConfig: forced }, contents);
      const call = r.functionCalls[0];
      assert(call.name === "get_weather" && city(call.args), r);
      contents.push(r.candidates[0].content, { role: "user", parts: [genai.createPartFromFunctionResponse(call.id, call.name, { weather: "sunny, 21 C" })] });
      const r2 = await generate({ tools: weather }, contents);
      return `${JSON.stringify(call.args)} -> ${JSON.stringify(r2.text)}`;
    }],
    ["streamed_tool_call", async () => {
      const calls = [];
      for await (const ch of await c.models.generateContentStream({ model, contents: "Weather in Rome?", config: { maxOutputTokens: 64, temperature: 0, tools: weather, toolConfig: forced } })) calls.push(...(ch.functionCalls || []));
      assert(calls.length && calls[0].name === "get_weather" && city(calls[0].args), calls);
      return JSON.stringify(calls[0].args);
    }],
    ["structured_output", async () => {
      const r = await generate({ maxOutputTokens: 64, temperature: 0, responseMimeType: "application/json", responseJsonSchema: CITY_SCHEMA }, "A city, as JSON.");
      const parsed = JSON.parse(r.text);
      assert(isCity(parsed), parsed);
      const e = await generate({ responseMimeType: "text/x.enum", responseSchema: { type: "STRING", enum: ["red", "blue"] } }, "A colour.");
      assert(["red", "blue"].includes(e.text), e.text);
      return `${JSON.stringify(parsed)}; enum ${e.text}`;
    }],
    ["count_tokens", async () => {
      const counted = await c.models.countTokens({ model, contents: "Say hello." });
      const r = await generate({ maxOutputTokens: 4 });
      assert(counted.totalTokens === r.usageMetadata.promptTokenCount, { counted, usage: r.usageMetadata });
      return `${counted.totalTokens} = promptTokenCount`;
    }],
    ["usage", async () => {
      const r = await generate({}, "Say hello.", client("usage"));
      return { usage: { input: r.usageMetadata.promptTokenCount, output: r.usageMetadata.candidatesTokenCount } };
    }],
    ["error_401", () => expectError(() => generate({}, "x", client("main", "nope")), genai.ApiError, 401)],
    ["error_400", () => expectError(() => generate({ candidateCount: 2 }, "x"), genai.ApiError, 400)],
    ["error_upstream_429", () => expectError(() => generate({}, "x", client("fail429")), genai.ApiError, 502)],
    ["error_upstream_5xx", () => expectError(() => generate({}, "x", client("fail5xx")), genai.ApiError, 502)],
  ]);
}

(async () => {
  const only = process.argv.slice(4);
  for (const [name, fn] of [["chat", chatCases], ["responses", responsesCases], ["anthropic", anthropicCases], ["gemini", geminiCases]]) {
    if (!only.length || only.includes(name)) await fn();
  }
})();
