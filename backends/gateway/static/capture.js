// AudioWorklet: microphone samples -> 16 kHz mono float32 chunks of 100 ms, posted to the page.
class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / 16000;  // input samples per output sample
    this.phase = 0;
    this.chunk = new Float32Array(1600);
    this.filled = 0;
  }
  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    for (; this.phase < input.length; this.phase += this.step) {
      this.chunk[this.filled++] = input[Math.floor(this.phase)];
      if (this.filled === this.chunk.length) {
        this.port.postMessage(this.chunk.slice(0));
        this.filled = 0;
      }
    }
    this.phase -= input.length;
    return true;
  }
}
registerProcessor("capture", Capture);
