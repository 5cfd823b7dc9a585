#include "layers/train_data.hpp"

#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "layers/checkpoint/checkpoint.hpp"
#include "layers/data/text.hpp"

namespace nerve::layers {

namespace {

/// `[1, 28, 28]` from a dataset's sample shape.
shape sample_shape_of(const data::dataset& d) {
  std::vector<std::int64_t> dims(d.sample_shape.begin(), d.sample_shape.end());
  return shape(std::move(dims));
}

}  // namespace

namespace {

/// The windows of a text model's corpus (`--data`, else Debian's `fortunes`): the
/// training part's and the validation part's, from one read of the corpus.
std::pair<std::shared_ptr<const data::dataset>, std::shared_ptr<const data::dataset>> text_sets(const train_options& o) {
  if (o.normalize)
    throw std::invalid_argument("--normalize scales image pixels, but model '" + o.model + "' reads text");
  const std::filesystem::path dir =
      o.data == data::fashion_mnist_default_dir ? std::filesystem::path(data::fortunes_default_dir) : o.data;
  const auto corpus = data::load_text_corpus(dir);
  const auto context = static_cast<std::size_t>(gpt_context);
  return {std::make_shared<const data::dataset>(data::text_dataset(corpus, data::text_part::train, context)),
          std::make_shared<const data::dataset>(data::text_dataset(corpus, data::text_part::validation, context))};
}

/// The run's set of `which` split: given in memory, else its .npy pair, else the model's
/// own (Fashion-MNIST's, or a text model's corpus).
std::shared_ptr<const data::dataset> run_set(const std::shared_ptr<const data::dataset>& given,
                                             const data::npy_files& files, const train_options& o, data::split which,
                                             std::size_t classes) {
  if (given) return given;
  if (files.empty() && reads_text(o.model)) {
    auto sets = text_sets(o);
    return which == data::split::train ? sets.first : sets.second;
  }
  const data::load_options loading{o.normalize};
  if (!files.empty())
    return std::make_shared<const data::dataset>(data::load_npy_pair(files.inputs, files.labels, loading, classes));
  return std::make_shared<const data::dataset>(data::load_fashion_mnist(o.data, which, loading));
}

}  // namespace

std::shared_ptr<const data::dataset> run_training_set(const train_options& o, std::size_t classes) {
  return run_set(o.train_set, o.train_data, o, data::split::train, classes);
}

std::shared_ptr<const data::dataset> run_test_set(const train_options& o, std::size_t classes) {
  return run_set(o.test_set, o.test_data, o, data::split::test, classes);
}

void load_own_data(train_options& o) {
  // A text model's corpus, read once for both sets: the preset's context and vocabulary.
  if (reads_text(o.model) && !o.train_set && !o.test_set && o.train_data.empty() && o.test_data.empty())
    std::tie(o.train_set, o.test_set) = text_sets(o);
  if (!o.train_set && !o.train_data.empty()) o.train_set = run_training_set(o, 0);
  if (!o.test_set && !o.test_data.empty()) o.test_set = run_test_set(o, o.train_set ? o.train_set->classes : 0);
  if (o.train_set && o.test_set) check_test_samples(*o.train_set, *o.test_set, o);
  if (o.train_set) data::check_augment(o.augment, o.train_set->sample_shape);
}

std::optional<preset_shape> own_data_shape(const train_options& o) {
  auto set = o.train_set ? o.train_set : o.test_set;
  if (!set && reads_text(o.model) && o.test_data.empty()) set = text_sets(o).second;  // its vocabulary
  if (!set) return std::nullopt;
  return preset_shape{sample_shape_of(*set), static_cast<std::int64_t>(set->classes)};
}

std::optional<std::int64_t> classes_of_weights(const std::filesystem::path& weights, std::string_view model,
                                               const shape& input) {
  // The head's name does not depend on its size: any class count finds it.
  const auto g = make_preset(model, 0, preset_shape{input, 2});
  std::string head;
  for (const auto& n : g.nodes())
    if (!n.is_input() && !n.layer->parameters().empty()) head = n.name;
  const auto d = checkpoint::load_checkpoint(weights);
  const std::string bias = head + ".bias";
  if (head.empty() || !d.contains(bias) || d.at(bias).shape.size() != 1) return std::nullopt;
  return static_cast<std::int64_t>(d.at(bias).shape[0]);
}

graph make_preset_for(const train_options& o) {
  const auto data = own_data_shape(o);
  return make_preset(o.model, o.seed, data.value_or(preset_shape{}));
}

void check_test_samples(const data::dataset& train, const data::dataset& test, const train_options& o) {
  if (train.sample_shape == test.sample_shape) return;
  auto named = [](const char* what, const data::npy_files& f) {
    return std::string(what) + (f.empty() ? "" : " (" + f.inputs.string() + ")");
  };
  throw std::invalid_argument(named("the test data", o.test_data) + " has samples of " + sample_shape_of(test).to_string() +
                              " but " + named("the training data", o.train_data) + " of " +
                              sample_shape_of(train).to_string());
}

std::size_t output_classes(const graph& g) {
  // A row of scores per sample, or per token of a sequence ([T, vocab]): its last dimension.
  return static_cast<std::size_t>(g.nodes()[g.output()].output_shape.dims().back());
}

}  // namespace nerve::layers
