// The browser page: microphone -> input.append (16 kHz float32, 100 ms each), reply audio
// (24 kHz float32) scheduled back to back as it arrives, listen/speak state, text, and the
// first-audio latency: from the moment the user went quiet to the first reply audio.
"use strict";
const $ = (id) => document.getElementById(id);
const gw = window.gw = { state: "idle", text: "", chunks: 0, scheduledS: 0, latencies: [], errors: [] };
const QUIET_RMS = 0.01, QUIET_MS = 300;
let ws = null, capture = null, playback = null, nextPlay = 0, lastLoud = 0, quietSince = null, awaitingAudio = false;

function setState(state) { gw.state = state; $("state").textContent = state; $("state").className = state; }
function status(text) { $("status").textContent = text; }
function send(message) { if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message)); }

function toBase64(floats) {
  const bytes = new Uint8Array(floats.buffer, floats.byteOffset, floats.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function fromBase64(text) {
  const binary = atob(text), bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

function onChunk(samples) {
  let sum = 0;
  for (const s of samples) sum += s * s;
  const now = performance.now();
  if (Math.sqrt(sum / samples.length) > QUIET_RMS) { lastLoud = now; quietSince = null; }
  else if (lastLoud && quietSince === null && now - lastLoud > QUIET_MS) { quietSince = lastLoud; awaitingAudio = true; }
  send({ type: "input.append", input: { audio: toBase64(samples) } });
}

function play(samples, rate) {
  const buffer = playback.createBuffer(1, samples.length, rate);
  buffer.copyToChannel(samples, 0);
  const source = playback.createBufferSource();
  source.buffer = buffer;
  source.connect(playback.destination);
  nextPlay = Math.max(nextPlay, playback.currentTime + 0.05);
  source.start(nextPlay);
  nextPlay += buffer.duration;
  gw.chunks += 1; gw.scheduledS += buffer.duration;
  $("received").textContent = `${gw.chunks} chunks, ${gw.scheduledS.toFixed(1)} s scheduled`;
}

function onAudio(event) {
  if (awaitingAudio && quietSince !== null) {
    const ms = Math.round(performance.now() - quietSince);
    gw.latencies.push(ms);
    $("latency").textContent = `${ms} ms (after you went quiet)`;
  }
  awaitingAudio = false;
  setState("speaking");
  play(fromBase64(event.audio), event.sample_rate || 24000);
}

const handlers = {
  "session.queued": (e) => status(`queued: position ${e.position}, about ${e.estimated_wait_s} s`),
  "session.queue_done": () => { status("starting"); send({ type: "session.init", payload: {} }); },
  "session.created": (e) => { status(`session ${e.session_id}`); setState("listening"); startMicrophone(); },
  "response.output_text.delta": (e) => { gw.text += e.text; $("text").textContent = gw.text; if (e.end_of_turn) { gw.text += "\n"; } },
  "response.output_audio.delta": onAudio,
  "response.listen": () => setState("listening"),
  "response.done": () => setState("listening"),
  "error": (e) => { gw.errors.push(e.error); status(`error ${e.error.code}: ${e.error.message}`); },
  "session.closed": (e) => { status(`closed (${e.reason})`); stop(); },
};

async function startMicrophone() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  capture = new AudioContext();
  await capture.audioWorklet.addModule("static/capture.js");
  const node = new AudioWorkletNode(capture, "capture");
  node.port.onmessage = (e) => onChunk(e.data);
  capture.createMediaStreamSource(stream).connect(node);
}

function start() {
  const key = $("key").value.trim();
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime?mode=audio&model=minicpm-o-4.5`;
  ws = new WebSocket(url, key ? ["map.realtime", `apikey.${key}`] : ["map.realtime"]);
  playback = new AudioContext({ sampleRate: 24000 });
  nextPlay = 0;
  ws.onmessage = (message) => { const event = JSON.parse(message.data); (handlers[event.type] || (() => {}))(event); };
  ws.onclose = () => { if (gw.state !== "idle") stop(); };
  $("start").disabled = true; $("stop").disabled = false; status("connecting");
}

function stop() {
  send({ type: "session.close", reason: "user_stop" });
  if (capture) capture.close();
  capture = null;
  setState("idle");
  $("start").disabled = false; $("stop").disabled = true;
}

$("start").onclick = start;
$("stop").onclick = stop;
if (new URLSearchParams(location.search).has("autostart")) start();
