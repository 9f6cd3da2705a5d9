// A CartPole env client for rlgate, written from proto/README.md and the .proto files alone.
//
//   npm ci && node client.mjs --server 127.0.0.1:50051 --episodes 3
//   node client.mjs --server 127.0.0.1:50051 --mode wrong-spaces
//
// "run" mode (the default) checks the health service, opens one PolicyService/Connect stream with one
// sub-env, plays --episodes CartPole-v1 episodes on its own JavaScript CartPole, sends Close and prints a
// JSON summary on stdout. "wrong-spaces" mode sends a hello whose observation space is float64 (a common
// JavaScript slip: numbers are doubles) and prints the final status the server ends the stream with.
// Exit status: 0 when the run went as the README says, 1 otherwise (the reason on stderr).

import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));

const { values: args } = parseArgs({
  options: {
    server: { type: "string", default: "127.0.0.1:50051" },
    mode: { type: "string", default: "run" }, // run | wrong-spaces
    episodes: { type: "string", default: "3" },
    seed: { type: "string", default: "0" },
    token: { type: "string" }, // the server's --token, sent as `authorization: Bearer <token>`
    "proto-dir": { type: "string", default: path.join(HERE, "..", "..", "proto") },
    "timeout-s": { type: "string", default: "60" }, // the whole run, however it goes
  },
});
const EPISODES = Number(args.episodes);
const TIMEOUT_MS = Number(args["timeout-s"]) * 1000;

// Nothing may hang: past the time limit the client gives up, whatever it is waiting for.
const watchdog = setTimeout(() => fail(`no result within ${args["timeout-s"]} s`), TIMEOUT_MS);
watchdog.unref();

function fail(reason) {
  console.error(`client.mjs: ${reason}`);
  process.exit(1);
}

// ---------------------------------------------------------------------------------------------------
// The contract: the .proto files loaded at run time, `proto/` as the include path (proto/README.md).
// keepCase keeps the proto's field names (observation_space, not observationSpace); enums arrive as
// their names ("DTYPE_INT32"); int64 fields as strings, so that nothing is rounded; oneofs: true adds
// a `kind` field naming the member that is set.
// ---------------------------------------------------------------------------------------------------

const definition = protoLoader.loadSync(["rlgate/v1/policy.proto", "grpc/health/v1/health.proto"], {
  includeDirs: [args["proto-dir"]],
  keepCase: true,
  enums: String,
  longs: String,
  defaults: true,
  oneofs: true,
});
const loaded = grpc.loadPackageDefinition(definition);
const PolicyService = loaded.rlgate.v1.PolicyService;
const Health = loaded.grpc.health.v1.Health;

// Keepalive as the README's "Deadlines" asks: ping after 10 s without traffic, give up 5 s later.
const CHANNEL_OPTIONS = { "grpc.keepalive_time_ms": 10000, "grpc.keepalive_timeout_ms": 5000 };

function authMetadata() {
  const metadata = new grpc.Metadata();
  if (args.token !== undefined) metadata.set("authorization", `Bearer ${args.token}`);
  return metadata;
}

// ---------------------------------------------------------------------------------------------------
// Tensors: dtype + shape + data, the values little-endian in C order (README, "Tensors"). DataView
// writes the byte order explicitly, so this holds on any machine.
// ---------------------------------------------------------------------------------------------------

function float32Tensor(values, shape) {
  const view = new DataView(new ArrayBuffer(values.length * 4));
  values.forEach((v, i) => view.setFloat32(i * 4, v, true)); // +-Infinity stays an IEEE infinity
  return { dtype: "DTYPE_FLOAT32", shape, data: Buffer.from(view.buffer) };
}

function float64Tensor(values, shape) {
  const view = new DataView(new ArrayBuffer(values.length * 8));
  values.forEach((v, i) => view.setFloat64(i * 8, v, true));
  return { dtype: "DTYPE_FLOAT64", shape, data: Buffer.from(view.buffer) };
}

function boolTensor(values, shape) {
  return { dtype: "DTYPE_BOOL", shape, data: Buffer.from(values.map((v) => (v ? 1 : 0))) };
}

// The integer actions of an answer, whatever integer dtype they come in (the README says to read it).
const INT_READERS = {
  DTYPE_INT8: [1, (view, at) => view.getInt8(at)],
  DTYPE_INT16: [2, (view, at) => view.getInt16(at, true)],
  DTYPE_INT32: [4, (view, at) => view.getInt32(at, true)],
  DTYPE_INT64: [8, (view, at) => Number(view.getBigInt64(at, true))],
  DTYPE_UINT8: [1, (view, at) => view.getUint8(at)],
  DTYPE_UINT16: [2, (view, at) => view.getUint16(at, true)],
  DTYPE_UINT32: [4, (view, at) => view.getUint32(at, true)],
  DTYPE_UINT64: [8, (view, at) => Number(view.getBigUint64(at, true))],
};

function readIntegers(tensor) {
  const reader = INT_READERS[tensor.dtype];
  if (reader === undefined) throw new Error(`actions of dtype ${tensor.dtype}, not an integer dtype`);
  const [size, read] = reader;
  const data = tensor.data;
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const count = tensor.shape.reduce((n, d) => n * Number(d), 1);
  if (data.byteLength !== count * size) throw new Error(`actions: ${data.byteLength} bytes for shape ${tensor.shape}`);
  return Array.from({ length: count }, (_, i) => read(view, i * size));
}

// ---------------------------------------------------------------------------------------------------
// CartPole-v1's spaces, as gymnasium declares them: Box(float32, [4]) whose velocity bounds are
// infinite, and Discrete(2). The bounds are the float32 values gymnasium holds: x threshold * 2 and
// 12 degrees * 2 in radians.
// ---------------------------------------------------------------------------------------------------

const THETA_THRESHOLD = (12 * 2 * Math.PI) / 360;
const X_THRESHOLD = 2.4;
const HIGH = [X_THRESHOLD * 2, Infinity, THETA_THRESHOLD * 2, Infinity];

function cartpoleSpaces(boxTensor) {
  return {
    observation_space: { box: { low: boxTensor(HIGH.map((h) => -h), [4]), high: boxTensor(HIGH, [4]) } },
    action_space: { discrete: { n: 2, start: 0 } },
  };
}

// ---------------------------------------------------------------------------------------------------
// CartPole-v1 as gymnasium computes it (cartpole.py: euler integration, reward 1 per step, the
// episode terminated past 2.4 m or 12 degrees, truncated at 500 steps by TimeLimit). The state is
// kept in doubles; observations are its float32 rounding, as gymnasium returns them.
// ---------------------------------------------------------------------------------------------------

// mulberry32: a small seeded generator, so that --seed repeats a run exactly.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class CartPole {
  static GRAVITY = 9.8;
  static MASSCART = 1.0;
  static MASSPOLE = 0.1;
  static TOTAL_MASS = CartPole.MASSPOLE + CartPole.MASSCART;
  static LENGTH = 0.5; // half the pole's length
  static POLEMASS_LENGTH = CartPole.MASSPOLE * CartPole.LENGTH;
  static FORCE_MAG = 10.0;
  static TAU = 0.02;
  static MAX_STEPS = 500;

  constructor(seed) {
    this.random = random(seed);
    this.state = null;
    this.steps = 0;
  }

  observation() {
    return this.state.map(Math.fround);
  }

  reset() {
    this.state = [0, 0, 0, 0].map(() => this.random() * 0.1 - 0.05); // uniform in [-0.05, 0.05)
    this.steps = 0;
    return this.observation();
  }

  step(action) {
    let [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? CartPole.FORCE_MAG : -CartPole.FORCE_MAG;
    const cos = Math.cos(theta);
    const sin = Math.sin(theta);
    const temp = (force + CartPole.POLEMASS_LENGTH * thetaDot ** 2 * sin) / CartPole.TOTAL_MASS;
    const thetaAcc =
      (CartPole.GRAVITY * sin - cos * temp) /
      (CartPole.LENGTH * (4.0 / 3.0 - (CartPole.MASSPOLE * cos ** 2) / CartPole.TOTAL_MASS));
    const xAcc = temp - (CartPole.POLEMASS_LENGTH * thetaAcc * cos) / CartPole.TOTAL_MASS;
    x += CartPole.TAU * xDot;
    xDot += CartPole.TAU * xAcc;
    theta += CartPole.TAU * thetaDot;
    thetaDot += CartPole.TAU * thetaAcc;
    this.state = [x, xDot, theta, thetaDot];
    this.steps += 1;
    const terminated = x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
    const truncated = this.steps >= CartPole.MAX_STEPS;
    return { obs: this.observation(), reward: 1.0, terminated, truncated };
  }
}

// ---------------------------------------------------------------------------------------------------
// The stream: writes, and reads one answer at a time; an error is the stream's final status.
// ---------------------------------------------------------------------------------------------------

function openStream(client) {
  const call = client.Connect(authMetadata()); // no deadline on Connect (README, "Deadlines")
  // Every call ends with a status: OK after Close, else the error (code and details).
  const status = new Promise((resolve) => call.on("status", resolve));
  call.on("error", () => {}); // the error is read from `status` (and from the failed read)
  const answers = call[Symbol.asyncIterator]();
  return {
    call,
    status,
    write: (message) => call.write(message),
    // The next ServerMessage; a stream that ends instead is an error, with its final status.
    async read() {
      const next = await answers.next().catch((error) => ({ error }));
      if (next.error !== undefined || next.done) {
        const { code, details } = await status;
        throw Object.assign(new Error(`stream ended: ${grpc.status[code]} ${details}`), { code, details });
      }
      return next.value;
    },
  };
}

// A google.protobuf.Struct of numbers. proto-loader ships its own struct.proto, whose fields stay camelCased
// even with keepCase: true: `number_value` would be dropped without a word, `numberValue` is kept.
function struct(numbers) {
  return { fields: Object.fromEntries(Object.entries(numbers).map(([k, v]) => [k, { numberValue: v }])) };
}

function stepMessage(obs, steps, reward, terminated, truncated) {
  const step = { obs: { tensor: float32Tensor(obs, [1, 4]) } }; // [N, 4] with N = 1 sub-env
  step.infos = [struct({ steps })]; // optional, one per sub-env: stored with the episode's observations
  if (reward !== undefined) {
    // Rewards as JavaScript has them, float64 (any float dtype is taken); the flags are bool [N].
    step.reward = float64Tensor([reward], [1]);
    step.terminated = boolTensor([terminated], [1]);
    step.truncated = boolTensor([truncated], [1]);
  }
  return { step };
}

function checkHealth(channelTarget) {
  const health = new Health(channelTarget, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const deadline = () => new Date(Date.now() + 5000);
  const ask = (service) =>
    new Promise((resolve, reject) =>
      // The health service needs no token (README, "Connecting").
      health.Check({ service }, { deadline: deadline() }, (error, answer) =>
        error ? reject(error) : resolve(answer.status),
      ),
    );
  return Promise.all(["", "rlgate.v1.PolicyService"].map(ask)).then(([all, policy]) => {
    health.close();
    return { "": all, "rlgate.v1.PolicyService": policy };
  });
}

async function run() {
  const health = await checkHealth(args.server);
  if (Object.values(health).some((s) => s !== "SERVING")) fail(`health: ${JSON.stringify(health)}`);

  const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const stream = openStream(client);
  stream.write({
    hello: { client_id: "node-cartpole", ...cartpoleSpaces(float32Tensor), num_envs: 1, explore: true },
  });
  const welcome = await stream.read();
  if (welcome.kind !== "welcome") fail(`the first answer is ${welcome.kind}, not welcome`);
  const versions = new Set([welcome.welcome.model_version]);

  const env = new CartPole(Number(args.seed));
  const episodes = []; // {length, return, terminated, truncated, reset_obs}
  let obs = env.reset();
  let episode = { length: 0, return: 0, reset_obs: obs };
  // The first step after the hello: the reset observation, no reward or flags (README, "The first step").
  stream.write(stepMessage(obs, 0));
  let envSteps = 0;

  // Each episode ends within 500 steps, so EPISODES * 500 answers bound the loop.
  for (let answers = 0; answers < EPISODES * CartPole.MAX_STEPS && episodes.length < EPISODES; answers++) {
    const answer = await stream.read();
    if (answer.kind !== "actions") fail(`an answer of kind ${answer.kind}`);
    versions.add(answer.actions.model_version);
    const [action] = readIntegers(answer.actions.actions.tensor); // Discrete: int32 [N]
    const { obs: next, reward, terminated, truncated } = env.step(action);
    envSteps += 1;
    episode.length += 1;
    episode.return += reward;
    stream.write(stepMessage(next, env.steps, reward, terminated, truncated));
    if (!(terminated || truncated)) continue;

    // The episode is over: that step carried its final observation, and its answer's action is to be
    // discarded (autoreset NEXT_STEP). The next episode's reset observation goes at once, without waiting
    // for that answer: the server answers both steps, in order.
    episodes.push({ ...episode, terminated, truncated });
    if (episodes.length < EPISODES) {
      obs = env.reset();
      episode = { length: 0, return: 0, reset_obs: obs };
      // A new episode's slot: its reset observation, reward 0 and flags false (checked, then ignored).
      stream.write(stepMessage(obs, 0, 0.0, false, false));
    }
    const discarded = await stream.read(); // the terminal step's answer
    if (discarded.kind !== "actions") fail(`an answer of kind ${discarded.kind}`);
    versions.add(discarded.actions.model_version);
  }
  if (episodes.length < EPISODES) fail(`only ${episodes.length} of ${EPISODES} episodes ended`);

  // Close: no episode is running (the last one ended), and the stream ends with OK at once.
  stream.write({ close: {} });
  const { code, details } = await stream.status;
  client.close();
  if (code !== grpc.status.OK) fail(`the stream ended with ${grpc.status[code]}: ${details}`);

  return {
    session_id: welcome.welcome.session_id,
    health,
    episodes: episodes.length,
    lengths: episodes.map((e) => e.length),
    returns: episodes.map((e) => e.return),
    terminated: episodes.map((e) => e.terminated),
    truncated: episodes.map((e) => e.truncated),
    reset_observations: episodes.map((e) => e.reset_obs),
    env_steps: envSteps,
    // int64 versions arrive as decimal strings (longs: String); they are small enough for a number.
    model_versions: [...versions].map(Number).sort((a, b) => a - b),
    status: grpc.status[code],
  };
}

async function wrongSpaces() {
  const client = new PolicyService(args.server, grpc.credentials.createInsecure(), CHANNEL_OPTIONS);
  const stream = openStream(client);
  // float64 bounds where the model's Box is float32: the server does not convert spaces.
  stream.write({
    hello: { client_id: "node-wrong-spaces", ...cartpoleSpaces(float64Tensor), num_envs: 1, explore: true },
  });
  const answer = await stream.read().catch((error) => error);
  client.close();
  if (!(answer instanceof Error)) fail(`the hello was answered with ${answer.kind}, not an error`);
  return { code: answer.code, code_name: grpc.status[answer.code], details: answer.details };
}

const modes = { run, "wrong-spaces": wrongSpaces };
if (!(args.mode in modes)) fail(`--mode is one of ${Object.keys(modes).join(", ")}`);
if (!(Number.isInteger(EPISODES) && EPISODES > 0)) fail("--episodes is a positive integer");
modes[args.mode]()
  .then((summary) => {
    console.log(JSON.stringify(summary));
    process.exit(0);
  })
  .catch((error) => fail(error.stack ?? String(error)));
