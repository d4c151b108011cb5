// The SVG chart writer: well-formed XML, one polyline per series, escaped text.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <hybridcache/sim/svg_chart.hpp>

namespace {

// A minimal XML well-formedness check: balanced, properly nested tags, quoted attributes,
// no raw '<' or '&' in text. Returns the number of elements, or -1 on error.
int count_elements_if_well_formed(const std::string& s, std::vector<std::string>* names = nullptr) {
  std::vector<std::string> stack;
  int elements = 0;
  std::size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  while (i < s.size()) {
    if (s[i] == '&') {
      const std::size_t semi = s.find(';', i);
      if (semi == std::string::npos || semi - i > 6) return -1;
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') { ++i; continue; }
    const std::size_t end = s.find('>', i);
    if (end == std::string::npos) return -1;
    std::string tag = s.substr(i + 1, end - i - 1);
    for (std::size_t q = 0, quotes = 0; q < tag.size(); ++q) {
      if (tag[q] == '"') ++quotes;
      if (tag[q] == '<' && quotes % 2 == 0) return -1;
      if (q + 1 == tag.size() && quotes % 2 != 0) return -1;
    }
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return -1;
      stack.pop_back();
    } else {
      const bool self_closing = tag.back() == '/';
      const std::string name = tag.substr(0, tag.find_first_of(" /\n"));
      if (names) names->push_back(name);
      ++elements;
      if (!self_closing) stack.push_back(name);
    }
    i = end + 1;
  }
  return stack.empty() ? elements : -1;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("svg: two panels, one polyline per policy, well formed") {
  using namespace hybridcache::sim;
  chart_panel hit{.title = "token hit rate", .x_label = "capacity", .y_label = "hit rate",
                  .x_format = axis_format::bytes, .y_format = axis_format::percent, .log_x = true};
  chart_panel ttft{.title = "P95 TTFT", .x_label = "capacity", .y_label = "ms",
                   .x_format = axis_format::bytes, .y_format = axis_format::ms, .log_x = true};
  const char* policies[] = {"marconi", "sglang+", "vllm+", "lru"};
  double k = 1;
  for (const char* p : policies) {
    hit.series.push_back({p, {{5e8, 0.05 * k}, {1e9, 0.1 * k}, {5e9, 0.2 * k}}});
    ttft.series.push_back({p, {{5e8, 900 / k}, {1e9, 800 / k}, {5e9, 700 / k}}});
    k += 0.5;
  }
  const std::string svg = to_svg({hit, ttft}, "chat & agent <synth-v1>");
  std::vector<std::string> names;
  CHECK(count_elements_if_well_formed(svg, &names) > 0);
  CHECK(names.front() == "svg");
  CHECK(count(svg, "<polyline") == 8);  // 4 policies × 2 panels
  CHECK(count(svg, "<circle") == 24);
  CHECK(svg.find("chat &amp; agent &lt;synth-v1&gt;") != std::string::npos);
  CHECK(svg.find("<title>sglang+</title>") != std::string::npos);
  CHECK(svg.find(">1 GB<") != std::string::npos);  // log-axis tick, bytes format
  CHECK(svg.find(">10%<") != std::string::npos);   // percent format
  // A series keeps its colour in both panels: the marconi polyline colour appears twice.
  const std::size_t first = svg.find("<polyline");
  const std::string colour = svg.substr(svg.find("stroke=\"", first) + 8, 7);
  CHECK(count(svg, "stroke=\"" + colour + "\" stroke-width=\"2\"") == 2);
}

TEST_CASE("svg: non-finite and non-positive (log axis) points are skipped; empty panels still render") {
  using namespace hybridcache::sim;
  chart_panel p{.title = "t", .log_x = true};
  p.series.push_back({"a", {{0.0, 1.0}, {1e9, std::nan("")}, {2e9, 0.5}, {4e9, 0.7}}});
  const std::string svg = to_svg({p, chart_panel{.title = "empty"}}, "x");
  CHECK(count_elements_if_well_formed(svg) > 0);
  CHECK(count(svg, "<polyline") == 1);
  CHECK(count(svg, "<circle") == 2);
  CHECK(svg.find("nan") == std::string::npos);
  CHECK(svg.find("inf") == std::string::npos);
}

TEST_CASE("svg: the tick helpers give round numbers") {
  using namespace hybridcache::sim::detail;
  const auto t = linear_ticks(0, 0.37);
  REQUIRE(t.size() >= 3);
  CHECK(t.front() == 0.0);
  CHECK(t[1] == doctest::Approx(0.1).epsilon(1e-12));  // 0.37/6 ≈ 0.062 rounds up to a step of 0.1
  const auto l = log_ticks(5e8, 5e9);
  CHECK(l == std::vector<double>{5e8, 1e9, 2e9, 5e9});
  CHECK(format_tick(0.125, hybridcache::sim::axis_format::percent) == "12.5%");
  CHECK(format_tick(2500, hybridcache::sim::axis_format::ms) == "2.5 s");
}
