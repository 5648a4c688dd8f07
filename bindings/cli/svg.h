#pragma once
// Minimal SVG/HTML writing helpers for the plan report (no dependencies beyond std).

#include <sstream>
#include <string>
#include <vector>

namespace autostage::cli {

// Escapes & < > " ' for text and attribute values.
std::string escapeXml(const std::string& text);
// A fixed palette, one colour per stage (cycles after 10); `dark` is a darker shade.
std::string stageColor(int stage, bool dark = false);
// Evenly spaced round tick values (1, 2 or 5 times a power of ten) covering [0, maximum].
std::vector<double> niceTicks(double maximum, int wanted = 8);

// An <svg> element built from shapes; numbers are written with one decimal.
class Svg {
 public:
  Svg(double width, double height, const std::string& id, const std::string& title);
  // `extra` is raw attribute text appended inside the tag, e.g. `class="op" data-stage="1"`.
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "",
            const std::string& tooltip = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke,
            const std::string& extra = "");
  // anchor: start | middle | end.
  void text(double x, double y, const std::string& text, const std::string& anchor = "start",
            const std::string& extra = "");
  std::string str() const;

 private:
  double width_, height_;
  std::string id_, title_;
  std::ostringstream body_;
};

}  // namespace autostage::cli
