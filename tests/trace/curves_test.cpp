// nerve-trace curves: reading a --metrics file line by line, the resume rule, the errors
// that name the line, and the page. (That the page draws in a real browser is
// tests/trace/curves_browser_test.sh.)

#include "apps/trace/curves.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

using namespace nerve::trace;

namespace {

training_curves read_curves(const std::string& text, diagnostics& d) {
  std::istringstream in(text);
  return read_metrics(in, "m.jsonl", d);
}

std::string step_line(int t, int epoch, const std::string& loss = "0.5") {
  return R"({"kind":"step","step":)" + std::to_string(t) + R"(,"epoch":)" + std::to_string(epoch) + R"(,"batch":1,"loss":)" +
         loss + R"(,"accuracy":0.25,"lr":0.1,"samples":4,"seconds":0.01,"samples_per_s":400})" + "\n";
}
std::string epoch_line(int epoch, int step, const std::string& test = "0.75") {
  return R"({"kind":"epoch","epoch":)" + std::to_string(epoch) + R"(,"step":)" + std::to_string(step) +
         R"(,"steps":2,"train_loss":0.5,"train_accuracy":0.5,"test_loss":0.6,"test_accuracy":)" + test +
         R"(,"seconds":1,"samples_per_s":8,"interrupted":false})" + "\n";
}
const std::string run_line = R"({"kind":"run","format":"nerve-metrics-1","settings":{"model":"mlp","lr":0.1}})" "\n";

}  // namespace

TEST_SUITE("trace.curves") {
  TEST_CASE("a run's lines read as steps and epochs in order, null as NaN") {
    diagnostics d;
    auto c = read_curves(run_line + step_line(0, 1) + step_line(1, 1, "null") + epoch_line(1, 2, "null") + "\n", d);
    CHECK(d.items.empty());
    REQUIRE(c.steps.size() == 2);
    CHECK(c.steps[0].loss == 0.5);
    CHECK(std::isnan(c.steps[1].loss));
    REQUIRE(c.epochs.size() == 1);
    CHECK(c.epochs[0].step == 2);
    CHECK(std::isnan(c.epochs[0].test_accuracy));
    REQUIRE(c.runs.size() == 1);
    CHECK(c.runs[0].description == "mlp, lr 0.1");
    CHECK(c.runs[0].resume_step == -1);
  }

  TEST_CASE("a resumed run's records replace those of the steps and epochs it replays") {
    diagnostics d;
    std::string text = run_line;
    for (int t = 0; t < 5; ++t) text += step_line(t, t < 2 ? 1 : 2);
    text += epoch_line(1, 2);
    text += R"({"kind":"run","resume":{"step":3,"epoch":2}})" "\n";
    for (int t = 3; t < 6; ++t) text += step_line(t, 2, "0.25");
    text += epoch_line(2, 6);
    auto c = read_curves(text, d);
    CHECK(d.items.empty());
    REQUIRE(c.steps.size() == 6);
    for (int t = 0; t < 6; ++t) CHECK(c.steps[std::size_t(t)].step == t);
    CHECK(c.steps[2].loss == 0.5);
    CHECK(c.steps[3].loss == 0.25);  // the resumed run's
    CHECK(c.steps[4].loss == 0.25);
    CHECK(c.superseded == 2);        // steps 3 and 4 of the first run
    CHECK(c.epochs.size() == 2);
    REQUIRE(c.runs.size() == 2);
    CHECK(c.runs[1].resume_step == 3);
  }

  TEST_CASE("a step written twice with no resume between is kept once, the later, with a warning") {
    diagnostics d;
    auto c = read_curves(run_line + step_line(0, 1) + step_line(0, 1, "0.125"), d);
    REQUIRE(c.steps.size() == 1);
    CHECK(c.steps[0].loss == 0.125);
    CHECK(d.error_count() == 0);
    CHECK(d.mentions("m.jsonl: line 3: warning: step 0 again (first on line 2)"));
  }

  TEST_CASE("every malformed line is an error naming its line, and reading goes on") {
    diagnostics d;
    std::string text = run_line;
    text += "{\"kind\":\"step\",\"step\":1,]\n";                                                       // 2
    text += "[1,2]\n";                                                                                 // 3
    text += R"({"step":1})" "\n";                                                                      // 4
    text += R"({"kind":"step","epoch":1,"loss":1,"accuracy":0.5,"lr":0.1})" "\n";                   // 5
    text += R"({"kind":"step","step":-1,"epoch":1,"loss":1,"accuracy":0.5,"lr":0.1})" "\n";         // 6
    text += R"({"kind":"step","step":1,"epoch":1,"loss":1e400,"accuracy":0.5,"lr":0.1})" "\n";      // 7
    text += R"({"kind":"step","step":1,"epoch":1,"loss":1,"accuracy":1.5,"lr":0.1})" "\n";          // 8
    text += R"({"kind":"step","step":1.5,"epoch":1,"loss":1,"accuracy":0.5,"lr":0.1})" "\n";        // 9
    text += R"({"kind":"epoch","epoch":1,"step":2,"train_loss":"low","train_accuracy":0.5,"test_loss":0,"test_accuracy":0})" "\n";  // 10
    text += R"({"kind":"mystery"})" "\n";                                                              // 11
    text += std::string(70, '[') + std::string(70, ']') + "\n";                                       // 12
    text += step_line(3, 1);                                                                           // 13
    text += R"({"kind":"step","step":4,"epoch":1,"loss":1,"accuracy":0.5,"lr":0.1}x)";              // 14, no newline
    auto c = read_curves(text, d);
    CHECK(d.mentions("m.jsonl: line 2: error: not a JSON object: syntax error"));
    CHECK(d.mentions("m.jsonl: line 3: error: not a JSON object: a metrics line is one object"));
    CHECK(d.mentions("m.jsonl: line 4: error: no \"kind\" string"));
    CHECK(d.mentions("m.jsonl: line 5: error: \"step\" is missing"));
    CHECK(d.mentions("m.jsonl: line 6: error: \"step\": -1 is not a whole number from 0 to"));
    CHECK(d.mentions("m.jsonl: line 7: error: a number too large for a double"));
    CHECK(d.mentions("m.jsonl: line 8: error: \"accuracy\": 1.5 is not a number from 0 to 1 (or null)"));
    CHECK(d.mentions("m.jsonl: line 9: error: \"step\": 1.5 is not a whole number"));
    CHECK(d.mentions("m.jsonl: line 10: error: \"train_loss\": \"low\" is not a finite number (or null)"));
    CHECK(d.mentions("m.jsonl: line 11: warning: unknown kind \"mystery\", skipped"));
    CHECK(d.mentions("m.jsonl: line 12: error: JSON nested deeper than 64 levels"));
    CHECK(d.mentions("m.jsonl: line 14: error: not a JSON object: syntax error"));
    CHECK(d.error_count() == 11);
    CHECK(d.warning_count() == 1);
    REQUIRE(c.steps.size() == 1);  // the good line still reads
    CHECK(c.steps[0].step == 3);
  }

  TEST_CASE("a torn line is skipped with a warning naming it, and a record written straight after it is read") {
    // A full disk cut a line short; a writer that went on appending wrote its run line
    // straight after the fragment; the file ends with another line cut short.
    diagnostics d;
    std::string text = run_line + step_line(0, 1) + step_line(1, 1);
    text += R"({"kind":"step","step":2,"epoch":1,"lo)";                                                // 4: torn, then a run line
    text += R"({"kind":"run","resume":{"step":2,"epoch":1}})" "\n";
    text += R"({"kind":"step","step":2,"epo)" "\n";                                                   // 5: torn alone
    text += step_line(2, 1, "0.25");                                                                   // 6
    text += R"({"kind":"step","step":3,"epoch":1,"loss":0.)";                                          // 7: torn, the last
    auto c = read_curves(text, d);
    CHECK(d.error_count() == 0);
    CHECK(d.mentions("m.jsonl: line 4: warning: a torn line: its first 37 bytes were cut short while they were written"));
    CHECK(d.mentions("those bytes are skipped, the record is read"));
    CHECK(d.mentions("m.jsonl: line 5: warning: a torn line of 28 bytes, cut short while it was written"));
    CHECK(d.mentions("m.jsonl: line 7: warning: a torn line of 43 bytes, cut short while it was written (a full disk or a "
                     "crash?), skipped (the last line, with no newline)"));
    CHECK(d.warning_count() == 3);
    REQUIRE(c.runs.size() == 2);
    CHECK(c.runs[1].resume_step == 2);  // the record after the fragment was read
    REQUIRE(c.steps.size() == 3);
    CHECK(c.steps[2].loss == 0.25);
    // A cut inside a string, a number or a literal is torn as well; garbage after a whole
    // object, or a character the parser refuses, is not.
    for (const std::string cut : {R"({"kind":"st)", R"({"kind":"step","loss":0.)", R"({"kind":"step","ok":tr)", "{"}) {
      CAPTURE(cut);
      diagnostics one;
      read_curves(cut + "\n", one);
      CHECK(one.error_count() == 0);
      CHECK(one.mentions("a torn line of"));
    }
    for (const std::string bad : {R"({"kind":"run"} x)", R"({"kind":"run",])", R"({"kind":"run","resume":{"step":1)" "}]"}) {
      CAPTURE(bad);
      diagnostics one;
      read_curves(bad + "\n", one);
      CHECK(one.error_count() == 1);
      CHECK(one.warning_count() == 0);
    }
  }

  TEST_CASE("a range test's run line is kept, so the page draws its losses against its rates") {
    diagnostics d;
    const std::string lr_find_run =
        R"({"kind":"run","format":"nerve-metrics-1","lr_find":{"min_lr":1e-07,"max_lr":10,"steps":3},)"
        R"("settings":{"model":"mlp"}})" "\n";
    auto c = read_curves(lr_find_run + step_line(0, 1) + step_line(1, 1) + step_line(2, 1), d);
    REQUIRE(c.runs.size() == 1);
    CHECK(c.runs[0].lr_find);
    CHECK(c.runs[0].description == "mlp, learning-rate range test");
    std::ostringstream out;
    write_curves_page(c, "lr", out);
    CHECK(out.str().find("\"lr_find\":true") != std::string::npos);
    auto plain = read_curves(run_line + step_line(0, 1), d);
    CHECK_FALSE(plain.runs[0].lr_find);
  }

  TEST_CASE("the page needs nothing from the network and its title cannot end the script") {
    diagnostics d;
    auto c = read_curves(run_line + step_line(0, 1) + step_line(1, 1, "null") + epoch_line(1, 2), d);
    std::ostringstream out;
    auto stats = write_curves_page(c, "curves </script> of <b>", out);
    const auto page = out.str();
    CHECK(stats.steps == 2);
    CHECK(stats.epochs == 1);
    CHECK(stats.bytes == page.size());
    for (const char* banned : {"http://", "https://", "<script src", "<link", "@import", "url("}) {
      CAPTURE(banned);
      CHECK(page.find(banned) == std::string::npos);
    }
    CHECK(page.find("/*NERVE_CURVES_DATA*/") == std::string::npos);
    CHECK(page.find("curves </script>") == std::string::npos);
    CHECK(page.find("\"loss\":[0.5,null]") != std::string::npos);
  }
}
