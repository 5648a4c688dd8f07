// SVG helpers; see svg.h.
#include "bindings/cli/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace autostage::cli {
namespace {

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", v);
  return buffer;
}

}  // namespace

std::string escapeXml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string stageColor(int stage, bool dark) {
  // Tableau 10 (grey replaced by indigo: grey marks transfers), light and dark variants.
  static const char* light[] = {"#7fb3e0", "#ffb36b", "#8fd18a", "#f08c8d", "#c3a6dd",
                                "#c9a49a", "#f4b5de", "#b5c7f0", "#dede7a", "#7fd9e3"};
  static const char* darker[] = {"#2f6ea8", "#c9651a", "#3a8c35", "#b9393b", "#7e5aa3",
                                 "#86574c", "#c25e9e", "#4662b5", "#9c9c24", "#1f98a6"};
  const int i = ((stage % 10) + 10) % 10;
  return dark ? darker[i] : light[i];
}

std::vector<double> niceTicks(double maximum, int wanted) {
  if (!(maximum > 0)) return {0};
  const double raw = maximum / wanted;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power * 10;
  for (double f : {1.0, 2.0, 5.0})
    if (f * power >= raw) {
      step = f * power;
      break;
    }
  std::vector<double> ticks;
  for (int i = 0; i * step <= maximum * (1 + 1e-9); ++i) ticks.push_back(i * step);
  return ticks;
}

Svg::Svg(double width, double height, const std::string& id, const std::string& title)
    : width_(width), height_(height), id_(id), title_(title) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& extra, const std::string& tooltip) {
  body_ << "<rect x=\"" << number(x) << "\" y=\"" << number(y) << "\" width=\"" << number(std::max(w, 0.0))
        << "\" height=\"" << number(h) << "\" fill=\"" << fill << "\"" << (extra.empty() ? "" : " ") << extra;
  if (tooltip.empty()) {
    body_ << "/>\n";
  } else {
    body_ << "><title>" << escapeXml(tooltip) << "</title></rect>\n";
  }
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke,
               const std::string& extra) {
  body_ << "<line x1=\"" << number(x1) << "\" y1=\"" << number(y1) << "\" x2=\"" << number(x2)
        << "\" y2=\"" << number(y2) << "\" stroke=\"" << stroke << "\"" << (extra.empty() ? "" : " ")
        << extra << "/>\n";
}

void Svg::text(double x, double y, const std::string& text, const std::string& anchor,
               const std::string& extra) {
  body_ << "<text x=\"" << number(x) << "\" y=\"" << number(y) << "\" text-anchor=\"" << anchor << "\""
        << (extra.empty() ? "" : " ") << extra << ">" << escapeXml(text) << "</text>\n";
}

std::string Svg::str() const {
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" << id_ << "\" width=\"" << number(width_)
      << "\" height=\"" << number(height_) << "\" viewBox=\"0 0 " << number(width_) << " "
      << number(height_) << "\" role=\"img\" aria-label=\"" << escapeXml(title_) << "\">\n"
      << "<title>" << escapeXml(title_) << "</title>\n"
      << body_.str() << "</svg>\n";
  return out.str();
}

}  // namespace autostage::cli
