"""Engine metrics, written after vLLM's examples/offline_inference/metrics.py with the same calls a vLLM
user makes: generate, then read llm.get_metrics() (vLLM's Counter / Gauge / Histogram / Vector records, the
names vLLM's Prometheus endpoint serves) and print each by its type. LLM() serves the embedded model."""

from minirunner import LLM, SamplingParams
from minirunner.metrics.reader import Counter, Gauge, Histogram, Vector

openings = ["ROMEO.", "JULIET.", "Enter HAMLET", "To be, or not to be"]
params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(disable_log_stats=False)
llm.generate(openings, params)

for metric in llm.get_metrics():
    if isinstance(metric, Gauge):
        print(f"{metric.name} (gauge) = {metric.value:.1f}")
    elif isinstance(metric, Counter):
        reason = metric.labels.get("finished_reason")  # vllm:request_success has one per reason
        print(f"{metric.name} (counter) = {metric.value}" + (f"  [{reason}]" if reason else ""))
    elif isinstance(metric, Vector):
        print(f"{metric.name} (vector) = {metric.values}")
    elif isinstance(metric, Histogram):
        print(f"{metric.name} (histogram)")
        print(f"    sum = {metric.sum:.2f}")
        print(f"    count = {metric.count}")
        for bucket_le, value in metric.buckets.items():
            print(f"    {bucket_le} = {value}")
