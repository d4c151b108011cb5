// hybridcache/sim/svg_chart.hpp
//
// A small, dependency-free SVG line-chart writer for replay results: one or more panels
// side by side, each with axes, "nice" ticks, a grid, one polyline (plus point markers) per
// series and a legend. A series keeps its colour across panels when it has the same name,
// so "hit rate vs capacity" and "P95 TTFT vs capacity" read as one figure.
//
// The output is standalone SVG 1.1 (no scripts, no external fonts or stylesheets); every
// text is XML-escaped. Non-finite points are skipped. Cost: O(total points).
//
//   sim::chart_panel hit{.title = "token hit rate", .x_label = "capacity", .y_label = "hit rate",
//                        .x_format = sim::axis_format::bytes, .y_format = sim::axis_format::percent,
//                        .log_x = true};
//   hit.series.push_back({"marconi", {{5e8, 0.12}, {1e9, 0.20}, {5e9, 0.31}}});
//   std::ofstream("plot.svg") << sim::to_svg({hit}, "synth-v1 chat");
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hybridcache::sim {

/// How axis tick labels are printed.
enum class axis_format {
  number,   ///< shortest of %g
  percent,  ///< value × 100 with a "%" sign (values are fractions)
  bytes,    ///< SI bytes: 500 MB, 5 GB
  ms,       ///< milliseconds: "250 ms", "1.5 s"
};

/// One line: a name (for the legend) and its (x, y) points, drawn in the given order.
struct chart_series {
  std::string name{};
  std::vector<std::pair<double, double>> points{};
  std::string colour{};  ///< CSS colour; empty: from the palette, by name
  std::string dash{};    ///< SVG stroke-dasharray (e.g. "6,4"); empty: solid
};

/// One plot area with its own axes.
struct chart_panel {
  std::string title{};
  std::string x_label{};
  std::string y_label{};
  axis_format x_format = axis_format::number;
  axis_format y_format = axis_format::number;
  bool log_x = false;        ///< logarithmic x axis (needs x > 0; other points are skipped)
  bool y_from_zero = true;   ///< include 0 in the y range
  std::vector<chart_series> series{};
};

/// Sizes in SVG user units (pixels).
struct chart_style {
  int panel_width = 520;
  int panel_height = 360;
  int margin_left = 72;
  int margin_right = 20;
  int margin_top = 56;
  int margin_bottom = 92;  ///< room for the x label and the legend
};

/// The smallest of 1, 2, 5 or 10 × 10^k that is >= raw (> 0): a round tick step.
[[nodiscard]] inline double round_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

namespace detail {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  const auto c1 = static_cast<unsigned char>(s[i + 1]);
  if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90))
    return 0;
  return n;
}

// XML 1.0 text: markup characters escaped; control characters XML forbids (below 0x20 but
// tab, LF, CR) and bytes that are not UTF-8 become U+FFFD, so any label gives a valid SVG.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0 || (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == '\x7f') {
      out += "\xEF\xBF\xBD";
      i += n == 0 ? 1 : n;
      continue;
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string format_tick(double v, axis_format f) {
  switch (f) {
    case axis_format::percent: return fmt("%g%%", std::round(v * 1e6) / 1e4);
    case axis_format::bytes: {
      const double a = std::fabs(v);
      if (a >= 1e12) return fmt("%g TB", v / 1e12);
      if (a >= 1e9) return fmt("%g GB", v / 1e9);
      if (a >= 1e6) return fmt("%g MB", v / 1e6);
      if (a >= 1e3) return fmt("%g kB", v / 1e3);
      return fmt("%g B", v);
    }
    case axis_format::ms: return std::fabs(v) >= 1000 ? fmt("%g s", v / 1000) : fmt("%g ms", v);
    case axis_format::number: break;
  }
  return fmt("%g", v);
}

/// Ticks at multiples of 1, 2 or 5 × 10^k covering [lo, hi], about `target` of them.
inline std::vector<double> linear_ticks(double lo, double hi, int target = 6) {
  if (!(hi > lo)) return {lo};
  const double step = round_step((hi - lo) / target);
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

/// Ticks at 1, 2, 5 × 10^k inside [lo, hi] (lo > 0); the end points when that gives < 2.
inline std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); e += 1.0)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  if (t.size() < 2) t = {lo, hi};
  return t;
}

inline constexpr const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                          "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace detail

/// Renders `panels` side by side under `title` as a standalone SVG document.
[[nodiscard]] inline std::string to_svg(std::span<const chart_panel> panels, std::string_view title,
                                        const chart_style& style = {}) {
  using detail::fmt;
  using detail::xml_escape;
  // One colour per distinct series name, in first-seen order.
  std::vector<std::string> names;
  for (const auto& p : panels)
    for (const auto& s : p.series)
      if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  auto colour_of = [&](const chart_series& s) -> std::string {
    if (!s.colour.empty()) return s.colour;
    const auto i = static_cast<std::size_t>(std::find(names.begin(), names.end(), s.name) - names.begin());
    return detail::palette[i % std::size(detail::palette)];
  };
  // Legend layout: items flow left to right under the plot and wrap at the panel's edge.
  const double legend_x0 = style.margin_left, legend_x1 = style.panel_width;
  auto legend_item_width = [](const chart_series& s) { return 34 + 7.0 * static_cast<double>(s.name.size()); };
  int legend_rows = 1;
  for (const auto& p : panels) {
    int rows = 1;
    double lx = legend_x0;
    for (const auto& s : p.series) {
      if (lx > legend_x0 && lx + legend_item_width(s) > legend_x1) { lx = legend_x0; ++rows; }
      lx += legend_item_width(s);
    }
    legend_rows = std::max(legend_rows, rows);
  }

  const int W = style.panel_width * static_cast<int>(std::max<std::size_t>(panels.size(), 1));
  const int H = style.panel_height + 32 + 16 * (legend_rows - 1);
  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + std::to_string(W) + "\" height=\"" +
       std::to_string(H) + "\" viewBox=\"0 0 " + std::to_string(W) + " " + std::to_string(H) +
       "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(W) + "\" height=\"" + std::to_string(H) +
       "\" fill=\"white\"/>\n";
  o += "<text x=\"" + std::to_string(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" +
       xml_escape(title) + "</text>\n";

  for (std::size_t pi = 0; pi < panels.size(); ++pi) {
    const chart_panel& p = panels[pi];
    const double ox = static_cast<double>(pi) * style.panel_width;
    const double oy = 32;
    const double x0 = ox + style.margin_left, x1 = ox + style.panel_width - style.margin_right;
    const double y0 = oy + style.panel_height - style.margin_bottom, y1 = oy + style.margin_top;

    auto usable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!p.log_x || x > 0); };
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
    for (const auto& s : p.series)
      for (auto [x, y] : s.points)
        if (usable(x, y)) {
          xmin = std::min(xmin, x); xmax = std::max(xmax, x);
          ymin = std::min(ymin, y); ymax = std::max(ymax, y);
        }
    if (!std::isfinite(xmin)) { xmin = p.log_x ? 1 : 0; xmax = p.log_x ? 10 : 1; ymin = 0; ymax = 1; }
    if (p.y_from_zero) ymin = std::min(ymin, 0.0);
    if (xmax <= xmin) { xmax = p.log_x ? xmin * 10 : xmin + 1; }
    if (ymax <= ymin) ymax = ymin + (ymin == 0 ? 1 : std::fabs(ymin));
    std::vector<double> yt = detail::linear_ticks(ymin, ymax);
    ymin = std::min(ymin, yt.front());
    ymax = std::max(ymax, yt.back());
    const std::vector<double> xt = p.log_x ? detail::log_ticks(xmin, xmax) : detail::linear_ticks(xmin, xmax);
    if (!p.log_x) { xmin = std::min(xmin, xt.front()); xmax = std::max(xmax, xt.back()); }

    auto sx = [&](double x) {
      const double f = p.log_x ? (std::log(x) - std::log(xmin)) / (std::log(xmax) - std::log(xmin))
                               : (x - xmin) / (xmax - xmin);
      return x0 + f * (x1 - x0);
    };
    auto sy = [&](double y) { return y0 - (y - ymin) / (ymax - ymin) * (y0 - y1); };

    o += "<g>\n";
    o += "<text x=\"" + fmt("%.1f", (x0 + x1) / 2) + "\" y=\"" + fmt("%.1f", oy + 24) +
         "\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">" + xml_escape(p.title) + "</text>\n";
    for (double v : yt) {
      const std::string y = fmt("%.1f", sy(v));
      o += "<line x1=\"" + fmt("%.1f", x0) + "\" y1=\"" + y + "\" x2=\"" + fmt("%.1f", x1) + "\" y2=\"" + y +
           "\" stroke=\"#e5e5e5\"/>\n";
      o += "<text x=\"" + fmt("%.1f", x0 - 6) + "\" y=\"" + y + "\" dy=\"4\" text-anchor=\"end\">" +
           xml_escape(detail::format_tick(v, p.y_format)) + "</text>\n";
    }
    for (double v : xt) {
      const std::string x = fmt("%.1f", sx(v));
      o += "<line x1=\"" + x + "\" y1=\"" + fmt("%.1f", y1) + "\" x2=\"" + x + "\" y2=\"" + fmt("%.1f", y0) +
           "\" stroke=\"#e5e5e5\"/>\n";
      o += "<text x=\"" + x + "\" y=\"" + fmt("%.1f", y0 + 16) + "\" text-anchor=\"middle\">" +
           xml_escape(detail::format_tick(v, p.x_format)) + "</text>\n";
    }
    o += "<rect x=\"" + fmt("%.1f", x0) + "\" y=\"" + fmt("%.1f", y1) + "\" width=\"" + fmt("%.1f", x1 - x0) +
         "\" height=\"" + fmt("%.1f", y0 - y1) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    o += "<text x=\"" + fmt("%.1f", (x0 + x1) / 2) + "\" y=\"" + fmt("%.1f", y0 + 36) + "\" text-anchor=\"middle\">" +
         xml_escape(p.x_label) + (p.log_x ? " (log scale)" : "") + "</text>\n";
    o += "<text transform=\"translate(" + fmt("%.1f", ox + 16) + "," + fmt("%.1f", (y0 + y1) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(p.y_label) + "</text>\n";

    for (const auto& s : p.series) {
      const std::string c = colour_of(s);
      const std::string dash = s.dash.empty() ? "" : "\" stroke-dasharray=\"" + xml_escape(s.dash);
      std::string pts;
      for (auto [x, y] : s.points)
        if (usable(x, y)) pts += fmt("%.1f", sx(x)) + "," + fmt("%.1f", sy(y)) + " ";
      if (!pts.empty()) pts.pop_back();
      o += "<polyline fill=\"none\" stroke=\"" + xml_escape(c) + dash + "\" stroke-width=\"2\" points=\"" + pts + "\">" +
           "<title>" + xml_escape(s.name) + "</title></polyline>\n";
      for (auto [x, y] : s.points)
        if (usable(x, y))
          o += "<circle cx=\"" + fmt("%.1f", sx(x)) + "\" cy=\"" + fmt("%.1f", sy(y)) + "\" r=\"3\" fill=\"" + xml_escape(c) + "\"/>\n";
    }
    // Legend: rows under the x label; the document grows by one line per extra row.
    double lx = x0, ly = y0 + 58;
    for (const auto& s : p.series) {
      const std::string c = colour_of(s);
      const double item = legend_item_width(s);
      if (lx > x0 && lx + item > ox + legend_x1) { lx = x0; ly += 16; }  // wrap the legend
      o += "<line x1=\"" + fmt("%.1f", lx) + "\" y1=\"" + fmt("%.1f", ly) + "\" x2=\"" + fmt("%.1f", lx + 18) + "\" y2=\"" +
           fmt("%.1f", ly) + "\" stroke=\"" + xml_escape(c) + "\" stroke-width=\"3\"" +
           (s.dash.empty() ? std::string() : " stroke-dasharray=\"" + xml_escape(s.dash) + "\"") + "/>\n";
      o += "<text x=\"" + fmt("%.1f", lx + 22) + "\" y=\"" + fmt("%.1f", ly) + "\" dy=\"4\">" + xml_escape(s.name) +
           "</text>\n";
      lx += item;
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

/// Convenience overload for a braced list of panels.
[[nodiscard]] inline std::string to_svg(const std::vector<chart_panel>& panels, std::string_view title,
                                        const chart_style& style = {}) {
  return to_svg(std::span<const chart_panel>(panels), title, style);
}

}  // namespace hybridcache::sim
